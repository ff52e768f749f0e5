"""Drop-in entry points for training scripts written against other loaders.

``fmsdata.compat.fms_fsdp``: fms-fsdp's ``get_data_loader`` / ``get_dummy_loader`` over
its own ``train_config``, so a Bamba training script changes one import.
"""

__all__: list[str] = []
