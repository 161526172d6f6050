"""The file verl (``custom_reward_function.path``) and OpenRLHF (``--remote_rm_url``) load by path.

They execute it as a top-level module of its own (``importlib.util.spec_from_file_location``). Loading
``rewards/adapters.py`` that way works too, but makes a second copy of everything in it; this file only
imports, so what they get is ``rewards.adapters``' own objects: a MissingGoldWarning that filters and
``pytest.warns`` recognise, and a ``compute_score`` that pickles by reference, as verl's prime reward
manager needs to send it to its process pool.
"""

from rewards.adapters import compute_score, reward_func

__all__ = ["compute_score", "reward_func"]
