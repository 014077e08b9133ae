"""The course around the learner's modules: exercises, release, command line, lab and figures.

exercises.py  the exercise table, @exercise, reference mode (KVLIB_SOLUTIONS=1)
inputs.py     input checks shared by stubs and references (a ValueError naming the problem)
release.py    learner stubs and notebooks generated from solutions/
cli.py        `kvlib check | generate | bench | course | lab | present`
lab.py        JupyterLab for learners and presenters; runs solution notebooks
plotting.py   every figure of the course
"""
