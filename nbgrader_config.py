"""nbgrader configuration for this repository: solutions/ is the instructor's source, notebooks/
is the learner release (`kvlib course release` regenerates it; so does
`nbgrader generate_assignment 01-attention --no-db --force`)."""

c = get_config()  # noqa: F821 (provided by nbgrader)

c.CourseDirectory.course_id = "kvlib"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "notebooks"
# The generated notebooks must not depend on who ran nbgrader, or when.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# Every graded cell finishes well inside this on a 2-core laptop.
c.Execute.timeout = 120
# Validate (nbgrader validate) runs nbgrader's Execute; this kernel client waits for the kernel in short
# steps, so a lost zmq wake-up does not hold the learner for the whole timeout (kvlib/grading/execute.py).
c.AsyncKernelManager.client_class = "kvlib.grading.execute.SteppedKernelClient"
