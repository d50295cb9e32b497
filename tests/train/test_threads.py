"""`set_compute_threads` sets torch's and NumPy's BLAS thread counts."""

import torch
from threadpoolctl import threadpool_info, threadpool_limits

from shoal.core.threads import set_compute_threads


def test_sets_torch_and_blas_threads():
    before = torch.get_num_threads()
    with threadpool_limits(limits=None):  # restores the BLAS limits on exit
        try:
            set_compute_threads(1)
            assert torch.get_num_threads() == 1
            blas = [pool for pool in threadpool_info() if pool["user_api"] == "blas"]
            assert blas and all(pool["num_threads"] == 1 for pool in blas)
        finally:
            torch.set_num_threads(before)
