"""The Discover tab: Hugging Face search, a file's facts, downloads."""
