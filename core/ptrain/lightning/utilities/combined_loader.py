"""``CombinedLoader``: several iterables (dataloaders) read together, in one of Lightning's four
modes.

The iterables come as one object or a collection of them (dicts, lists, tuples and namedtuples,
nested); each step takes one item from some of them and gives back the same collection with
each iterable replaced by its item. A collection whose members are all plain values (numbers,
text) or that is empty counts as one iterable, not a collection of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any, Callable

from torch.utils.data.dataloader import _BaseDataLoaderIter, _MultiProcessingDataLoaderIter

from ptrain.hookspecs import hookimpl

#: mode -> how the combined length follows from the iterables' lengths
MODES: dict[str, Callable[[list[int]], int]] = {
    "min_size": min, "max_size_cycle": max, "max_size": max, "sequential": sum,
}


# -- a collection of iterables, flattened and rebuilt -------------------------------------------


def _children(node: Any) -> list[Any] | None:
    """The members of a collection node, or ``None`` for a leaf."""
    if isinstance(node, dict):
        members = list(node.values())
    elif isinstance(node, (list, tuple)):
        members = list(node)
    else:
        return None
    if all(isinstance(member, (int, float, str)) for member in members):
        return None  # a container of plain values (or an empty one) is an iterable itself
    return members


def flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves of ``tree`` in order, and a spec that :func:`unflatten` rebuilds it from."""
    members = _children(tree)
    if members is None:
        return [tree], None
    leaves, specs = [], []
    for member in members:
        sub_leaves, sub_spec = flatten(member)
        leaves += sub_leaves
        specs.append((len(sub_leaves), sub_spec))
    return leaves, (tree, specs)


def unflatten(leaves: list[Any], spec: Any) -> Any:
    """The collection ``spec`` describes, with ``leaves`` in its leaves' places."""
    if spec is None:
        return leaves[0]
    tree, specs = spec
    members, start = [], 0
    for count, sub_spec in specs:
        members.append(unflatten(leaves[start:start + count], sub_spec))
        start += count
    if isinstance(tree, dict):
        rebuilt = dict(zip(tree.keys(), members))
        if type(tree) is dict:
            return rebuilt
        if hasattr(tree, "default_factory"):  # a defaultdict
            return type(tree)(tree.default_factory, rebuilt)
        return type(tree)(rebuilt)
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*members)
    return type(tree)(members)


def _length(iterable: Any) -> int | float:
    """``len(iterable)``, or infinity for one without a length."""
    try:
        return len(iterable)
    except (TypeError, NotImplementedError):
        return float("inf")


# -- the modes ----------------------------------------------------------------------------------


class _ModeIterator(Iterator):
    """Iterates over ``iterables`` for one pass; each ``__next__`` returns ``(items,
    batch_idx, dataloader_idx)``. ``limits`` caps each iterable's number of items."""

    def __init__(self, iterables: list[Iterable], limits: list[int | float] | None) -> None:
        if limits is not None and len(limits) != len(iterables):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of "
                             f"iterables ({len(iterables)})")
        self.iterables, self.limits = iterables, limits
        self.iterators: list[Iterator] = []
        self._idx = 0

    def __iter__(self) -> _ModeIterator:
        self.iterators = [iter(iterable) for iterable in self.iterables]
        self._idx = 0
        return self

    def _lengths(self) -> list[int | float]:
        lengths = [_length(iterable) for iterable in self.iterables]
        if self.limits is not None:
            lengths = [min(length, limit) for length, limit in zip(lengths, self.limits)]
        return lengths

    def _counted(self, items: Any, dataloader_idx: int = 0) -> tuple[Any, int, int]:
        index, self._idx = self._idx, self._idx + 1
        return items, index, dataloader_idx

    def reset(self) -> None:
        self.iterators, self._idx = [], 0

    def __getstate__(self) -> dict[str, Any]:  # a DataLoader's iterator can't be pickled
        state = dict(self.__dict__)
        state["iterators"] = [None if isinstance(it, _BaseDataLoaderIter) else it
                              for it in self.iterators]
        return state


class _MinSize(_ModeIterator):
    """One item of each iterable per step, until the shortest runs out."""

    def __next__(self) -> tuple[Any, int, int]:
        return self._counted([next(iterator) for iterator in self.iterators])

    def __len__(self) -> int:
        lengths = [_length(iterable) for iterable in self.iterables]
        return min(lengths + list(self.limits)) if self.limits is not None else min(lengths)


class _MaxSizeCycle(_ModeIterator):
    """One item of each iterable per step, until the longest runs out; the others start over
    whenever they run out."""

    def __iter__(self) -> _MaxSizeCycle:
        super().__iter__()
        self._done = [False] * len(self.iterables)
        return self

    def __next__(self) -> tuple[Any, int, int]:
        items = []
        for i, iterator in enumerate(self.iterators):
            try:
                items.append(next(iterator))
            except StopIteration:
                self._done[i] = True
                if all(self._done):
                    raise
                self.iterators[i] = iter(self.iterables[i])
                items.append(next(self.iterators[i]))
        return self._counted(items)

    def __len__(self) -> int:
        return max(self._lengths())

    def reset(self) -> None:
        super().reset()
        self._done = []


class _MaxSize(_ModeIterator):
    """One item of each iterable per step, ``None`` for those that ran out, until all have."""

    def __next__(self) -> tuple[Any, int, int]:
        items, any_left = [], False
        for iterator in self.iterators:
            try:
                items.append(next(iterator))
                any_left = True
            except StopIteration:
                items.append(None)
        if not any_left:
            raise StopIteration
        return self._counted(items)

    def __len__(self) -> int:
        return max(self._lengths())


class _Sequential(_ModeIterator):
    """Each iterable to its end (or limit), one after the other; ``batch_idx`` starts at 0 for
    each, ``dataloader_idx`` says which. Only the current iterable is open (one set of loader
    workers at a time)."""

    def __iter__(self) -> _Sequential:
        self._idx, self._current = 0, 0
        self._open_current()
        return self

    def _open_current(self) -> None:
        if self._current < len(self.iterables):
            self.iterators = [iter(self.iterables[self._current])]
        else:
            self.iterators = []

    def _advance(self) -> None:
        self._current += 1
        self._idx = 0
        self._open_current()

    def __next__(self) -> tuple[Any, int, int]:
        while True:
            if self._current >= len(self.iterables):
                raise StopIteration
            if self.limits is not None and self._idx >= self.limits[self._current]:
                self._advance()
                continue
            try:
                item = next(self.iterators[0])
            except StopIteration:
                self._advance()
                continue
            return self._counted(item, self._current)

    def __len__(self) -> int:
        return sum(self._lengths())

    def reset(self) -> None:
        super().reset()
        self._current = 0


_ITERATORS: dict[str, type[_ModeIterator]] = {
    "min_size": _MinSize, "max_size_cycle": _MaxSizeCycle, "max_size": _MaxSize,
    "sequential": _Sequential,
}


class CombinedLoader(Iterable):
    """Several iterables read together. ``iterables``: one iterable or a collection of them
    (``{"a": loader_a, "b": loader_b}``, ``[loader_a, loader_b]``). ``mode``:

    - ``"min_size"`` (default): a step takes one item from each; ends with the shortest.
    - ``"max_size_cycle"``: ends with the longest; the shorter ones start over as they run out.
    - ``"max_size"``: ends with the longest; ``None`` in the places of those that ran out.
    - ``"sequential"``: each iterable to its end, one after the other.

    Iterating gives ``(batch, batch_idx, dataloader_idx)``: ``batch`` is the collection with each
    iterable replaced by its item (in ``"sequential"`` mode, the one iterable's item, and
    ``dataloader_idx`` its position among the flattened iterables; 0 otherwise). ``len()``
    (after ``iter()``) is the number of steps; ``limits`` caps each iterable's items.
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"Unsupported mode {mode!r}, please select one of: "
                             f"{list(MODES)}.")
        self._iterables = iterables
        self._flattened, self._spec = flatten(iterables)
        self._mode = mode
        self._iterator: _ModeIterator | None = None
        self._limits: list[int | float] | None = None

    @property
    def iterables(self) -> Any:
        """The collection of iterables as given."""
        return self._iterables

    @property
    def mode(self) -> str:
        return self._mode

    @property
    def flattened(self) -> list[Any]:
        """The iterables as one flat list, in the collection's order."""
        return self._flattened

    @flattened.setter
    def flattened(self, flattened: list[Any]) -> None:
        if len(flattened) != len(self._flattened):
            raise ValueError(f"Mismatch in flattened length ({len(flattened)}) and existing "
                             f"length ({len(self._flattened)})")
        self._iterables = unflatten(flattened, self._spec)
        self._flattened = list(flattened)

    @property
    def sampler(self) -> Any:
        """Each iterable's ``sampler`` (``None`` where it has none), in the collection's shape."""
        return unflatten([getattr(x, "sampler", None) for x in self._flattened], self._spec)

    @property
    def batch_sampler(self) -> Any:
        return unflatten([getattr(x, "batch_sampler", None) for x in self._flattened],
                         self._spec)

    @property
    def limits(self) -> list[int | float] | None:
        """At most this many items of each iterable (``None``: no limit)."""
        return self._limits

    @limits.setter
    def limits(self, limits: int | float | list[int | float] | None) -> None:
        if isinstance(limits, (int, float)):
            limits = [limits] * len(self._flattened)
        elif isinstance(limits, list) and len(limits) != len(self._flattened):
            raise ValueError(f"Mismatch in number of limits ({len(limits)}) and number of "
                             f"iterables ({len(self._flattened)})")
        self._limits = limits

    def __iter__(self) -> CombinedLoader:
        iterator = _ITERATORS[self._mode](self._flattened, self._limits)
        iter(iterator)
        self._iterator = iterator
        return self

    def __next__(self) -> tuple[Any, int, int]:
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        items, batch_idx, dataloader_idx = next(self._iterator)
        if self._mode == "sequential":
            return items, batch_idx, dataloader_idx
        return unflatten(items, self._spec), batch_idx, dataloader_idx

    def __len__(self) -> int:
        """The number of steps of a pass (call ``iter()`` first, as in Lightning)."""
        if self._iterator is None:
            raise RuntimeError("Please call `iter(combined_loader)` first.")
        return len(self._iterator)

    def reset(self) -> None:
        """Forget the pass under way and shut down the loaders' worker processes."""
        if self._iterator is not None:
            self._iterator.reset()
            self._iterator = None
        for iterable in self._flattened:
            iterator = getattr(iterable, "_iterator", None)
            if isinstance(iterator, _MultiProcessingDataLoaderIter):
                iterator._shutdown_workers()

    def _dataset_length(self) -> int:
        """The combined length of the iterables' datasets, as the mode combines lengths."""
        lengths = [len(ds) for ds in (getattr(x, "dataset", None) for x in self._flattened)
                   if hasattr(ds, "__len__")]
        if not lengths:
            raise NotImplementedError("All datasets are iterable-style datasets.")
        return MODES[self._mode](lengths)


# -- several training loaders in a ptrain run ---------------------------------------------------


class TrainingBatches:
    """A :class:`CombinedLoader` read as ptrain's loop reads a training loader: its batches
    only (without Lightning's ``batch_idx`` and ``dataloader_idx``), and ``len()`` without a
    pass under way."""

    def __init__(self, combined: CombinedLoader):
        self.combined = combined

    def __iter__(self) -> Iterator[Any]:
        for batch, _, _ in iter(self.combined):
            yield batch

    def __len__(self) -> int:
        return len(_ITERATORS[self.combined.mode](self.combined.flattened, self.combined.limits))


def _is_loader_collection(value: Any) -> bool:
    """Whether ``value`` is a dict, list or tuple of DataLoaders (nested), which Lightning
    reads together as the training data."""
    from torch.utils.data import DataLoader

    if not isinstance(value, (dict, list, tuple)):
        return False
    leaves, spec = flatten(value)
    return spec is not None and all(isinstance(leaf, DataLoader) for leaf in leaves)


class CombinedTrainingData:
    """The ptrain callback (in every ``ptrain.lightning.Trainer`` run) that lets the training
    data be several loaders, as in Lightning: a :class:`CombinedLoader`, or a dict/list/tuple of
    DataLoaders (read in ``max_size_cycle`` mode, Lightning's default for training). Each loader
    in it is prepared as a single training loader is (a distributed sampler under several
    processes, ...); the loop then reads :class:`TrainingBatches`. The evaluation stages are
    left as they are."""

    name = "combined-training-data"

    @hookimpl(wrapper=True)
    def prepare_dataloader(self, trainer: Any, stage: str):
        prepared = yield
        if stage != "train":
            return prepared
        if _is_loader_collection(prepared):
            prepared = CombinedLoader(prepared, "max_size_cycle")
        if not isinstance(prepared, CombinedLoader):
            return prepared
        prepared.flattened = [
            trainer.hook.prepare_dataloader(trainer=trainer, dataloader=loader, stage=stage)
            for loader in prepared.flattened]
        return TrainingBatches(prepared)
