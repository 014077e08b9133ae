"""The commands, the top floor: what a learner, a presenter or an instructor runs.

cli.py            `kvlib check | generate | bench | course | lab | present` (`python -m kvlib`)
lab.py            JupyterLab for learners and presenters; runs solution notebooks
release.py        learner stubs and notebooks generated from solutions/ (`kvlib course release`)
sitting.py        how long each notebook takes, calibrated to careful readers (`kvlib course plan`)
translate.py      the course in another language from the English: translations/, solutions/<lang>/, notebooks/<lang>/
course_folder.py  an instructor's nbgrader course folder (`kvlib course init DIR`), its modes, the exchange
exchange.py       nbgrader's submit and collect between accounts, with the gaps closed
exchange_service.py  the exchange as a JupyterHub service, for students' servers and graders on other machines
class_grading.py  a whole class: `kvlib course autograde` (parallel, resumable), `kvlib course export-canvas`,
                  `kvlib course move-gradebook`
grading_record.py what autograde graded, and which run grades what, in the gradebook's own database
class_bench.py    `kvlib bench class`: a synthetic class graded, every score checked, timed
site.py           the course as a static site (`kvlib course site`): executed notebooks, glossary, guides
wrap_up.py        the closing page's summary (notebook 10c): each notebook's claims as recorded on this machine
Everything below stands without it: nothing in core, course, the learner modules, measure,
study, checks or grading imports kvlib.app.
"""
