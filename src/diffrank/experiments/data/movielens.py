"""MovieLens-100K (Harper & Konstan, ACM TiiS 2015; 943 users, 1 682 films, 100 000 ratings) for top-K
recommendation, under RecBole's default protocol for general recommendation (Zhao et al., CIKM 2021;
``recbole/properties/overall.yaml`` of RecBole 1.2.1: ``eval_args: {split: {RS: [0.8, 0.1, 0.1]}, group_by: user,
order: RO, mode: full}``).

File: the GroupLens ratings as RecBole ships them, ``recbole/dataset_example/ml-100k/ml-100k.inter`` inside the
wheel ``<data_dir>/recbole/recbole-1.2.1-py3-none-any.whl`` (``make data-ml100k`` downloads it), read from the zip
as it is (nothing unpacked). Tab-separated, header ``user_id:token  item_id:token  rating:float  timestamp:float``.

Protocol:

- implicit feedback: every rating, whatever its value, is a positive (RecBole's ``threshold: ~``); no filtering;
  user and item tokens are numbered 0, 1, ... in their sorted order;
- per-user random split 8:1:1 (:func:`split_by_user`): the ratings are shuffled once (``split_seed``), grouped by
  user keeping that order, and each user's first part trains, the next validates, the rest tests. The sizes follow
  RecBole's ``Dataset._calcu_split_ids`` (:func:`split_sizes`);
- full ranking over all items: validation ranks every item but the user's training positives, test every item but
  the training and validation positives (RecBole's full-sort evaluation, whose history for the test phase holds the
  training and validation interactions); a split evaluates the users that have a positive in it.

Seeds: ``split_seed`` fixes the split (fixed by default, so that a sweep over ``seed`` measures training variance),
``seed`` orders the training batches (:class:`~diffrank.experiments.data.samplers.EpochSampler`, stream 6).
"""

from __future__ import annotations

import io
import zipfile
from pathlib import Path
from typing import NamedTuple

import lightning as L
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from diffrank.experiments.data.samplers import EpochSampler

WHEEL = "recbole-1.2.1-py3-none-any.whl"
MEMBER = "recbole/dataset_example/ml-100k/ml-100k.inter"
FOLDER = "recbole"
RATIOS = (0.8, 0.1, 0.1)
HINT = "make data-ml100k (python -m pip download recbole==1.2.1 --no-deps -d <data_dir>/recbole)"


class Interactions(NamedTuple):
    """The ratings as index arrays: ``users`` and ``items`` ``(N,)`` int64 (0-based, tokens in sorted order),
    ``num_users`` and ``num_items`` (how many distinct tokens)."""

    users: np.ndarray
    items: np.ndarray
    num_users: int
    num_items: int


def wheel_path(data_dir: str | Path, wheel: str = WHEEL) -> Path:
    """Where the wheel is looked for: ``<data_dir>/recbole/<wheel>``."""
    return Path(data_dir) / FOLDER / wheel


def _numbered(tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """Tokens to 0-based indices in sorted order (numeric order when every token is an integer)."""
    try:
        keys = tokens.astype(np.int64)
    except ValueError:
        keys = tokens
    unique, index = np.unique(keys, return_inverse=True)
    return index.astype(np.int64), len(unique)


def read_interactions(path: str | Path, member: str = MEMBER) -> Interactions:
    """Read RecBole's atomic ``.inter`` file ``member`` from the zip (wheel) at ``path`` without unpacking it.

    Args:
        path: the wheel (any zip archive holding ``member``).
        member: the file inside it; its header must name ``user_id:token`` and ``item_id:token`` columns.

    Returns:
        :class:`Interactions` (one entry per line; ratings and timestamps are not kept).

    Raises:
        FileNotFoundError: no file at ``path``, or no ``member`` inside it; the message names what was looked for and
            the command that downloads it (``make data-ml100k``).
        ValueError: a header without the two id columns, or a line with fewer fields than the header.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"MovieLens-100K: {path} not found (the RecBole wheel holding {member}). "
                                f"Download it: {HINT}; or point paths.data_dir (env DIFFRANK_DATA) at the folder "
                                "that holds recbole/")
    with zipfile.ZipFile(path) as archive:
        if member not in archive.namelist():
            raise FileNotFoundError(f"MovieLens-100K: {path} has no {member}. Download the right wheel: {HINT}")
        text = io.TextIOWrapper(archive.open(member), encoding="utf-8").read()
    lines = [line.split("\t") for line in text.splitlines() if line.strip()]
    header = [h.strip() for h in lines[0]] if lines else []
    if "user_id:token" not in header or "item_id:token" not in header:
        raise ValueError(f"{path}:{member}: the header {header} lacks user_id:token / item_id:token")
    if any(len(row) < len(header) for row in lines[1:]):
        raise ValueError(f"{path}:{member}: a line has fewer than the header's {len(header)} fields")
    table = np.array([row[: len(header)] for row in lines[1:]], dtype=str).reshape(-1, len(header))
    users, num_users = _numbered(np.char.strip(table[:, header.index("user_id:token")]))
    items, num_items = _numbered(np.char.strip(table[:, header.index("item_id:token")]))
    return Interactions(users, items, num_users, num_items)


def split_sizes(total: int, ratios: tuple[float, ...] = RATIOS) -> list[int]:
    """How many of a user's ``total`` interactions each part gets, by RecBole's rule (``_calcu_split_ids``).

    Every part but the first gets ``floor(ratio · total)`` (ratios normalised to sum 1), the first the rest. Then,
    from the last part backwards, a part whose share ``ratio · total`` lies strictly between 0 and 1 (so that the
    floor left it empty) takes one interaction from the first part, as long as the first part holds more than one.
    With 8:1:1 a user with 10 or more ratings gets ``floor(total / 10)`` for validation and for test; a user with 2 to
    9 gets one test interaction and, with 3 or more, one validation interaction too.

    Returns:
        The part sizes (ints summing to ``total``).

    Raises:
        ValueError: a negative total, or ratios that are not positive.
    """
    if total < 0 or not ratios or min(ratios) <= 0:
        raise ValueError(f"need total >= 0 and positive ratios, got {total} and {ratios}")
    share = [r / sum(ratios) for r in ratios]
    count = [int(s * total) for s in share]
    count[0] = total - sum(count[1:])
    for i in range(1, len(share)):
        if count[0] <= 1:
            break
        if 0 < share[-i] * total < 1:
            count[-i] += 1
            count[0] -= 1
    return count


def split_by_user(users: np.ndarray, ratios: tuple[float, ...] = RATIOS, seed: int = 0) -> list[np.ndarray]:
    """RecBole's ``RS`` split grouped by user in random order: the interactions are shuffled once (from ``seed``),
    grouped by user in that order, and each user's interactions are cut into consecutive parts of
    :func:`split_sizes`.

    Args:
        users: ``(N,)`` int user index of each interaction.
        ratios: the parts' ratios (train, val, test by default).
        seed: the shuffle; the same seed gives the same parts.

    Returns:
        One ``(N_part,)`` int64 array of interaction indices per part (sorted), disjoint, covering ``0 … N-1``.
    """
    order = np.random.default_rng(seed).permutation(len(users))
    grouped = order[np.argsort(users[order], kind="stable")]
    bounds = np.flatnonzero(np.diff(users[grouped])) + 1
    parts: list[list[np.ndarray]] = [[] for _ in ratios]
    for chunk in np.split(grouped, bounds) if len(grouped) else []:
        cuts = np.cumsum(split_sizes(len(chunk), ratios))[:-1]
        for part, piece in zip(parts, np.split(chunk, cuts)):
            part.append(piece)
    return [np.sort(np.concatenate(p)) if p else np.zeros(0, np.int64) for p in parts]


def multi_hot(data: Interactions, index: np.ndarray) -> torch.Tensor:
    """``(num_users, num_items)`` float32 0/1: 1 where an interaction of ``index`` links the user and the item."""
    out = torch.zeros(data.num_users, data.num_items)
    out[torch.from_numpy(data.users[index]), torch.from_numpy(data.items[index])] = 1.0
    return out


class MovieLensDataModule(L.LightningDataModule):
    """MovieLens-100K users as batches, under RecBole's protocol (module docstring).

    Args:
        data_dir: the folder holding ``recbole/<wheel>`` (``paths.data_dir``).
        wheel: the wheel's file name.
        batch_size: training users per step. eval_batch_size: users per validation / test step.
        seed: the order of the training batches. split_seed: the split.
        num_workers: DataLoader workers.
        num_users / num_items: optional, checked against the data (the yaml states them for the model).

    Batches (users that have a positive in the split):

    - train: ``(users (B,) int64, positives (B, num_items) float32 0/1)``, the training positives;
    - val / test: ``(users (B,) int64, positives (B, num_items) float32, targets (B, num_items) float32 0/1,
      candidates (B, num_items) bool)``: the training positives, the split's positives, and the items ranked
      (False on the known positives: training ones, and for test the validation ones too).

    Raises:
        FileNotFoundError: (at construction) the wheel is missing; the message names it and ``make data-ml100k``.
        ValueError: (``setup``) ``num_users`` / ``num_items`` that disagree with the file.
    """

    def __init__(self, data_dir: str | Path = "data", wheel: str = WHEEL, batch_size: int = 128,
                 eval_batch_size: int = 256, seed: int = 0, split_seed: int = 0, num_workers: int = 0,
                 num_users: int | None = None, num_items: int | None = None) -> None:
        super().__init__()
        self.path = wheel_path(data_dir, wheel)
        if not self.path.is_file():
            read_interactions(self.path)  # raises the FileNotFoundError that names the file and the command
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.seed, self.split_seed, self.num_workers = int(seed), int(split_seed), int(num_workers)
        self.num_users, self.num_items = num_users, num_items
        self.splits: dict[str, TensorDataset] = {}

    def setup(self, stage: str | None = None) -> None:
        """Read the file and build the three splits once (deterministic from ``split_seed``)."""
        if self.splits:
            return
        data = read_interactions(self.path)
        for key, stated, found in (("num_users", self.num_users, data.num_users),
                                   ("num_items", self.num_items, data.num_items)):
            if stated is not None and int(stated) != found:
                raise ValueError(f"data.{key}={stated} does not match {self.path} ({found})")
        self.num_users, self.num_items = data.num_users, data.num_items
        self.parts = dict(zip(("train", "val", "test"), split_by_user(data.users, RATIOS, self.split_seed)))
        train, val, test = (multi_hot(data, self.parts[s]) for s in ("train", "val", "test"))
        users = torch.arange(data.num_users)
        has = train.sum(1) > 0
        self.splits["train"] = TensorDataset(users[has], train[has])
        for name, target, known in (("val", val, train), ("test", test, (train + val).clamp_max(1))):
            has = (target * (1 - known)).sum(1) > 0
            self.splits[name] = TensorDataset(users[has], train[has], target[has], known[has] == 0)

    def train_dataloader(self) -> DataLoader:
        """Training users in an order drawn from ``(seed, epoch)``; the last batch may be smaller."""
        ds = self.splits["train"]
        return DataLoader(ds, batch_size=self.batch_size, num_workers=self.num_workers,
                          sampler=EpochSampler(len(ds), self.seed, stream=6),
                          generator=torch.Generator().manual_seed(self.seed))

    def val_dataloader(self) -> DataLoader:
        """Validation users in order."""
        return DataLoader(self.splits["val"], batch_size=self.eval_batch_size, num_workers=self.num_workers)

    def test_dataloader(self) -> DataLoader:
        """Test users in order."""
        return DataLoader(self.splits["test"], batch_size=self.eval_batch_size, num_workers=self.num_workers)
