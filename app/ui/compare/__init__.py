"""The Compare window: its set-up, table, charts, the fastest choice and the PNG export."""
