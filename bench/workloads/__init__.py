"""What bench/ runs in a process of its own as a module, `python -m bench.workloads.NAME ARGS`: a reader of a
checkpoint being saved (the readers-during-saves drill), a busy loop (the co-located load), one way of tokenizing a
corpus (data_prep) and one generate() call (one_off_decode).  Code a child runs is a module like any other, never
text handed to `python -c`.  This package's own import is empty, so a child imports only what its module does.
"""
