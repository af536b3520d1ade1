"""`minigpt explore`'s page: what it is answered (explorer.py, over the Python API) and its HTML, CSS
and JavaScript.
"""
