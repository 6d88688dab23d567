"""The chat: the conversation, its rendering, the chat list and the live charts."""
