"""The speculative decode loop, built-in and SGLang, for validating profiles."""
