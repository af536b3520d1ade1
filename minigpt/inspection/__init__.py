"""Looking inside a model: one position traced through every stage (trace.py) and its text view
(trace_text.py), interventions on stages (interventions.py), a text scored token by token
(scoring.py), and the pictures (plot.py, matplotlib).
"""
