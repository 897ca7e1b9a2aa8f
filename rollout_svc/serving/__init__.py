"""Custom rollouts: generation for agents that run their own episodes, on the worker's
engine. generator validates and runs a request (the gRPC Generate API and the HTTP server
share it), batcher runs concurrent requests in shared engine calls, openai_server is the
OpenAI-compatible HTTP server (its request bodies in openai_requests, the chat turns it
remembers in chat_turns)."""
