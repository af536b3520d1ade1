"""Models in and out: a Hugging Face GPT-2 folder (hf.py), a Llama, Mistral, Qwen2 or Phi-3 folder
(llama.py, llama_config.py, llama_weights.py, llama_layout.py) or a nanoGPT checkpoint (nanogpt.py)
imported as a run folder (convert.py: what the readers share, and the run they become), and a run
exported as safetensors, a GPT-2 folder or a Llama-family one (export.py, llama_export.py);
gpt2_layout.py is GPT-2's layout and llama_layout.py the Llama family's, each read both ways.
"""
