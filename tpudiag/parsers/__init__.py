"""Bytes and text to the model: XSpace captures, HLO and LLO dumps. No rendering, no rules."""
