"""Training: the config, the one step, the checkpointer, the metrics and the loop that ties them.

    train.py (CLI) -> TrainConfig -> layout (sizes, strategy) -> Trainer(cfg, ctx, strategy).fit()
        each step: TrainStep (forward, loss, scaled backward with accumulation, gradient sync, clip, update)
        every log interval: StepRecord -> metrics.jsonl
        every eval interval: EvalRecord
        when a checkpoint is due: the state proves savable, then Checkpointer.save (atomic, training_state/)
"""
