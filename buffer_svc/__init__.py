"""buffer_svc: assembles complete groups from the trajectory stream into trainer batches."""
