"""What the learner's modules and notebooks stand on: the exercise table, input checks, figures, claims.

exercises.py  the exercise table, @exercise, reference mode (KVLIB_SOLUTIONS=1)
inputs.py     input checks shared by stubs and references (a ValueError naming the problem)
plotting.py   every figure of the course, as notebooks call them (plotting.roofline)
figures/      their homes: one module per notebook, and their one style
hints.py      `kvlib hint X.Y`: the hint files hints/<module>.md, read and validated, levels remembered
i18n.py       the learner's tools in another language (KVLIB_LANG): locale/<lang>/, its messages and hints
claims.py     claims as code: a verdict on a measurement printed from it (compare, against, exact), recorded
claims_table.py  every claim of the course, declared once, by notebook
Not here: the commands that build and open the course (kvlib.app).
"""
