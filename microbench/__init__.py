"""Measuring programs that torchrun runs on every rank."""
