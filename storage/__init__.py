"""The artifact layer: the only code that reads or writes an artifact folder's files.

    folder.py          staged, journalled saves; one writer; readers that never see half a save
    weights.py         stored weights into a model (the bottom: imports no other module here)
    hf.py, hub.py      Hugging Face's GPT-2 layout, and hub names resolved to cached folders
    int8_weights.py    an int8 artifact's tensors, saved and rebuilt into model/int8.py's modules
    meta.py            config.json as ArtifactMeta
    training_state.py  training_state/state.json as TrainingState
    artifact.py        the writers, and load_model(path, kinds=...) for every tool
    claim.py           claim_output_folder: the one place --overwrite deletes
    run_folder.py      a training run's folder, and the default checkpoint (pick_checkpoint)
    export.py          python -m storage.export: a folder transformers loads
"""
