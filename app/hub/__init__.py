"""Where models come from: built-in demo models (and, later, the Hugging Face hub). No Qt."""
