"""A program that fails the way a buggy training script does.

It prints a little progress to stdout, then a Python-style traceback to stderr,
and exits with status 3. Trainyard classifies a non-zero exit as a user code error
(permanent, no retry): the job is FAILED and its error carries the exit status
and the last lines of the replica's stderr.
"""
import sys

print("loading data ...", flush=True)
print("epoch 1 step 10 loss 0.9312", flush=True)

# What an uncaught exception would print, written out by hand to control the exit code.
sys.stderr.write(
    "Traceback (most recent call last):\n"
    '  File "train.py", line 42, in <module>\n'
    "    batch = next(loader)\n"
    '  File "train.py", line 17, in loader\n'
    "    raise ValueError(f\"bad record at line {n}\")\n"
    "ValueError: bad record at line 1337\n"
)
sys.stderr.flush()
sys.exit(3)
