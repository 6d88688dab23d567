"""The window around the rooms: main window, start-up, self-test, and the style, paths and text formats they share."""
