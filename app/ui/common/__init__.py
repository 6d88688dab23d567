"""What every room of the window shares: its style, its folders and how it writes sizes and rates."""
