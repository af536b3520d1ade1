"""Sampling: continuing a prompt one token at a time (generate.py), and the window's forward on
onnxruntime (onnx_window.py, the onnx extra).
"""
