"""Models in and out: a Hugging Face GPT-2 folder (hf.py), a Llama, Mistral or Qwen2 folder (llama.py,
llama_config.py, llama_weights.py, llama_layout.py) or a nanoGPT checkpoint (nanogpt.py) imported as
a run folder (convert.py: what the readers share, and the run they become), and a run exported as
safetensors or a GPT-2 folder (export.py); gpt2_layout.py is GPT-2's layout, read both ways.
"""
