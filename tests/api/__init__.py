"""The public API at grammarspec/'s top: generate, Conversation, tool calls, settings, templates, input errors."""
