"""Drafters behind one small interface (a draft model, prompt lookup, the n-gram cache, text-level
drafting across vocabularies), the kinds a user picks, and whether a draft fits a main model."""
