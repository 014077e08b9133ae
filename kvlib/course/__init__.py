"""What the learner's modules and notebooks stand on: the exercise table, input checks, figures.

exercises.py  the exercise table, @exercise, reference mode (KVLIB_SOLUTIONS=1)
inputs.py     input checks shared by stubs and references (a ValueError naming the problem)
plotting.py   every figure of the course
hints.py      `kvlib hint X.Y`: the hint files hints/<module>.md, read and validated, levels remembered
Not here: the commands that build and open the course (kvlib.app).
"""
