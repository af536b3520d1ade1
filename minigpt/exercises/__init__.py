"""Exercises: implement a part of the model, get it checked, then train with it (`minigpt exercise`).

    catalogue.py   what each exercise is (no torch): its text, what its file defines, what it
                   replaces in a model (config.EXERCISE_MODEL: the [model] it needs)
    starters/      the starter file of each exercise (package data), copied by `exercise start`
    learner.py     a learner's file: read, imported, its names found, its sha256; refusals in one line,
                   and code that tries to end the program said as the file's fault (LearnerFault)
    checks/        the checks of every exercise: each names one mistake in words, the way lesson 09's
                   "Common failure modes" do, comparing with minigpt's own modules
    isolated.py    a file checked in a child process with a time limit on each step (what `exercise
                   check` and `train --exercise` do), so code that exits, dies or hangs is its fault
    child.py       that child process: the file imported and checked, the answers sent back
    plug.py        a learner's module in a real model: the model's Parts, with the named stages
                   recorded around it so that trace, patching and attribution read it
    folder.py      the learner's folder: a starter written there, which exercises are started (no
                   file of it is imported)

What a run records of the file (name, path, sha256, source), and the refusals of a changed or
missing one at training and at every reading, belong to the run folder: minigpt/runs/exercise.py.
"""
