"""Blocks described on the meta device, made real: a stage's blocks, or the whole model.

A model factory may build its blocks under ``torch.device("meta")``: shapes and dtypes, no
storage. A rank then makes real only the blocks of its own stages, directly on its device
(:func:`materialize`), one block at a time: fresh storage per tensor (``to_empty``'s job, done
tensor by tensor so that a parameter several blocks share stays one), the model's initialiser
run on each submodule, children before parents, under the CPU generator seeded from the
submodule's global name, ``"<block name>.<path in the block>"`` (:func:`block_seed`), then the
block moved to the device. A block's values therefore depend on the seed and the names only,
never on the device or on which other blocks were built: a stage built alone equals the same
blocks of a whole build, bit for bit, on any device. (Initialising on the CPU keeps a CPU run
and a GPU run of one model starting from the same weights; the host holds one block at a
time.)
(And a whole layer ``layer0`` holding ``attn`` and ``ffn`` gets the values of the two
sub-layer blocks ``layer0.attn`` and ``layer0.ffn``.)

A parameter tied across blocks (GPT-2's ``wte``/``lm_head``) takes the value its FIRST holder's
initialiser gives it; a stage that holds only a later use builds the first holder as well (to
initialise it) and keeps just the shared tensor. Blocks that come real (a user's factory that
returns CPU blocks) are deep-copied and moved, as before.

``init(module, name)``: fills one submodule's own tensors (not its children's) in place from
the global generator, ``name`` its global name (``"<block name>.<path>"``, the block's name for
the block itself); None:
:func:`default_init`, torch's ``reset_parameters()`` (which also resets BatchNorm's running
statistics).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor, nn

__all__ = ["Init", "block_seed", "default_init", "is_meta", "materialize", "meta_copy",
           "on_meta"]

Init = Callable[[nn.Module, str], None]
"""``init(module, name)``: initialises one submodule of a materialised block in place (its own
tensors), drawing from the global torch generator; ``name``: ``"<block name>.<path>"``."""


def block_seed(seed: int, name: str) -> int:
    """The generator seed of the module ``name`` (``"<block>.<path>"``) in a model built with
    ``seed`` (63 bits of a sha256, stable across processes and Python versions)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def is_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` is on the meta device (has no values)."""
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


@contextlib.contextmanager
def on_meta() -> Iterator[None]:
    """Build modules on the meta device without running their initialisation: a block made
    real is initialised again anyway (:func:`materialize`), and torch's init functions on meta
    tensors go through ``torch._refs``, which imports ``torch._dynamo`` and sympy (~80 MB of
    resident memory in every process that builds a model, the launcher included)."""
    names = [n for n in dir(nn.init) if n.endswith("_") and not n.startswith("_")]
    saved = {name: getattr(nn.init, name) for name in names}

    def unchanged(tensor: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        return tensor

    try:
        for name in names:
            setattr(nn.init, name, unchanged)
        with torch.device("meta"):
            yield
    finally:
        for name, function in saved.items():
            setattr(nn.init, name, function)


def default_init(module: nn.Module, name: str = "") -> None:
    """torch's own initialisation of one module: its ``reset_parameters()``, if it has one."""
    reset = getattr(module, "reset_parameters", None)
    if callable(reset):
        reset()


def meta_copy(blocks: Sequence[nn.Module],
              device: torch.device | str = "meta") -> list[nn.Module]:
    """Deep copies of ``blocks`` whose every tensor is empty on ``device`` (shared tensors
    stay shared): on the meta device nothing is allocated, and under ``FakeTensorMode`` a
    real device gives fake tensors (no storage either) that optimizers step like real ones."""
    return _copies(blocks, torch.device(device))


def materialize(blocks: Sequence[nn.Module], names: Sequence[str], indices: Iterable[int], *,
                device: torch.device | str, tied: Sequence[Sequence[str]] = (),
                init: Init | None = None, seed: int = 0) -> list[nn.Module]:
    """Real copies of ``blocks[i]`` for ``i`` in ``indices`` on ``device`` (module docstring).

    ``names``: every block's name (its seed); ``tied``: the model's groups of tied parameter
    names (``ModelSpec.tied``). The copies share a tensor wherever the originals do.
    """
    device = torch.device(device)
    wanted = sorted(set(indices))
    first_of: dict[int, int] = {}  # block -> first holder of a tie it is a later use of
    for group in tied:
        holders = sorted({int(name.partition(".")[0]) for name in group})
        for block in holders[1:]:
            first_of[block] = holders[0]
    extra = {first_of[i] for i in wanted if i in first_of} - set(wanted)
    built = sorted(set(wanted) | extra)
    copies = dict(zip(built, copy.deepcopy([blocks[i] for i in built])))  # meta stays meta
    fresh = {i for i in built if is_meta(blocks[i])}
    tied_ids = _tied_ids(blocks, tied)
    kept: dict[int, Tensor] = {}  # id of a first holder's tied tensor -> its initial value
    made: dict[int, Tensor] = {}  # id of a meta tensor of the copies -> its real tensor
    cpu = torch.device("cpu")
    for index in built:  # one block at a time on the host, then on the device
        if index in fresh:
            _make_real(copies[index], made, cpu)
            shared = {id(p): p for p in blocks[index].parameters() if id(p) in tied_ids}
            restore = {key: kept[key] for key in shared if key in kept}
            _initialise(copies[index], init or default_init, seed, names[index])
            with torch.no_grad():
                for key, tensor in shared.items():
                    if key in restore:  # a later use: the first holder's value
                        _find(copies[index], blocks[index], tensor).copy_(restore[key])
                    else:
                        kept[key] = _find(copies[index], blocks[index], tensor).detach().clone()
        copies[index].to(device)
    return [copies[i] for i in wanted]


def _tied_ids(blocks: Sequence[nn.Module], tied: Sequence[Sequence[str]]) -> set[int]:
    """The ids of the parameters named in ``tied`` (``"<block>.<name>"``)."""
    found = set()
    for group in tied:
        index, _, name = group[0].partition(".")
        found.add(id(blocks[int(index)].get_parameter(name)))
    return found


def _find(copied: nn.Module, original: nn.Module, tensor: Tensor) -> Tensor:
    """The copy's parameter that stands where ``tensor`` stands in ``original``."""
    lookup = dict(copied.named_parameters())
    for name, parameter in original.named_parameters():
        if parameter is tensor:
            return lookup[name]
    raise AssertionError("a tied tensor vanished from its block")


def _make_real(block: nn.Module, made: dict[int, Tensor], device: torch.device) -> None:
    """Give every meta tensor of ``block`` empty storage on ``device`` (``to_empty``, tensor by
    tensor: ``made`` maps a meta tensor to its real one, so a shared tensor stays shared)."""
    for module in block.modules():
        tables: tuple[dict[str, Any], ...] = (module._parameters, module._buffers)
        for table in tables:
            for key, tensor in table.items():
                if tensor is not None and tensor.is_meta:
                    if id(tensor) not in made:
                        made[id(tensor)] = _empty_like(tensor, device)
                    table[key] = made[id(tensor)]


def _initialise(block: nn.Module, init: Init, seed: int, name: str) -> None:
    """``init`` on every submodule of ``block`` (children first, on the CPU), each from the
    CPU generator seeded with its global name; the caller's generator is left as it was, and
    no accelerator's generator is touched (``torch.manual_seed`` would reseed every CUDA
    device's too, which ``fork_rng(devices=[])`` does not restore)."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        for path, module in _post_order(block, "", set()):
            full = f"{name}.{path}" if path else name
            torch.default_generator.manual_seed(block_seed(seed, full))
            init(module, full)


def _post_order(module: nn.Module, path: str, seen: set[int]) -> list[tuple[str, nn.Module]]:
    """``(path, module)`` of every submodule once, children before their parent."""
    seen.add(id(module))
    found = []
    for child_name, child in module.named_children():
        if id(child) not in seen:
            found += _post_order(child, f"{path}.{child_name}" if path else child_name, seen)
    return [*found, (path, module)]


def _empty_like(tensor: Tensor, device: torch.device) -> Tensor:
    empty = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
    if isinstance(tensor, nn.Parameter):
        return nn.Parameter(empty, requires_grad=tensor.requires_grad)
    return empty


def _copies(blocks: Sequence[nn.Module], device: torch.device) -> list[nn.Module]:
    """Deep copies of ``blocks`` with an empty tensor on ``device`` in place of every tensor;
    a tensor shared between the blocks stays shared."""
    memo: dict[int, object] = {}
    for block in blocks:
        for module in block.modules():
            for table in (module._parameters, module._buffers):
                for tensor in table.values():
                    if tensor is not None and id(tensor) not in memo:
                        memo[id(tensor)] = _empty_like(tensor, device)
    copied: list[nn.Module] = copy.deepcopy(list(blocks), memo)
    return copied
