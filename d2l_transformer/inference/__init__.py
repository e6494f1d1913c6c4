"""Translating with a trained model: greedy decoding and beam search."""
