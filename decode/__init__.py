"""Everything that turns a model into tokens: generate(), the step runner and its traced or captured passes, the
thread chooser, sampling, a row's state, streamed text and speculative decoding.  model/ is the network alone."""
