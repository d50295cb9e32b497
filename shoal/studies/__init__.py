"""What drives and reads many runs, at the top of the house beside the API: reports over runs
(`shoal.studies.report`), hyperparameter searches (`shoal.studies.tune`) and policies exported
as standalone files (`shoal.studies.export`). ``shoal.report``, ``shoal.tune`` and
``shoal.export`` are their functions."""
