"""Models in and out: GPT-2 folders and nanoGPT checkpoints imported as run folders (convert.py), a run
exported as safetensors or a GPT-2 folder (export.py).
"""
