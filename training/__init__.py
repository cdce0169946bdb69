"""Training: the config, the one step, the checkpointer, the metrics and the loop that ties them.

    train.py (CLI) -> TrainConfig -> layout (sizes, strategy) -> Trainer(cfg, ctx, strategy).fit()
        each step: TrainStep (forward, loss, scaled backward with accumulation, gradient sync, clip, update)
        every log interval: StepRecord -> metrics.jsonl
        every eval / checkpoint interval: EvalRecord, Checkpointer.save (atomic, training_state/)
"""
