"""PPO's minibatch step for a population of seeds: the torch loss written once (PPO.loss_terms), its gradient by
autograd, made fast with torch.func over a leading seed axis and torch.compile.

A population is S algorithm objects of one config (one per seed). Their parameters are stacked into one
[S, ...] tensor per parameter; the step below is a pure function of those tensors:

    step(params, adam, minibatch, lr, active, loss inputs, buffers) -> params', adam', stats

    loss      = sum of algorithm.loss_terms(...)       the algorithm's own named terms, traced once
    grads     = torch.func.grad(loss)                  autograd, no hand-derived gradient (eager for one seed:
                                                       torch.autograd.grad; gradient_and_stats)
    clip      = PPO's global gradient-norm clip        (PPO detail #11)
    adam      = Adam's update written as tensor ops    (torch.optim.Adam's formula, in its order)

torch.func.vmap maps it over the seed axis and torch.compile fuses it (one compiled program for S seeds:
the per-operation overhead that once made a hand-written numpy gradient worth keeping is paid once, not
S times). Randomness never enters it: each seed's minibatch permutation is drawn outside from the seed's
own generator and passed in.

Minibatches have one shape for the whole run, so that the compiled program is built once: a seed's
minibatch rows are padded to rollout size / M and masked (`mask`: 1 on the seed's own rows, 0 on
padding), and every mean in the loss terms is a mean over the mask (algorithms/core.py masked_mean).
`active` freezes a seed whose numbers went non-finite: its parameters and Adam moments stay as they were.

A variant that changes the loss (adds or replaces a term in loss_terms) gets all of this by writing its
terms; one that keeps per-seed numbers its loss reads (PPO-KL's beta) declares them in `loss_inputs`, so
that they enter the program as [S] tensors instead of Python constants.

EagerPopulation, at the end, is the same interface for algo.backend=torch: each seed's own act, value and
update run eagerly, seed by seed (the token tasks' language-model policies; runs that must equal
torch.optim's own numbers).
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
from typing import Callable

import numpy as np
import torch
from torch import nn
from torch.utils import _pytree as pytree

from algorithms.core import stepped_parameters
from algorithms.ppo import learning_rate_from, sum_terms

Params = dict[str, torch.Tensor]
# The keys a minibatch of the population step carries: PPO's loss keys and the padding mask.
MASK = "mask"
# cpp_wrapper: the compiled program called from C++, not a Python wrapper (measured: a third less per call at S=1)
COMPILE_OPTIONS: dict = {"cpp_wrapper": True}


class LossModule(nn.Module):
    """A phase's loss (PPO's: algorithm.loss_terms of algorithm.evaluate_minibatch) as the forward of a module whose
    only submodule is the algorithm's policy, so that torch.func.functional_call can run the algorithm's own loss
    code on any seed's parameters."""

    def __init__(self, algorithm, phase):
        super().__init__()
        self.policy = algorithm.policy
        object.__setattr__(self, "algorithm", algorithm)  # not a module: kept out of the parameter tree
        self.phase = phase

    def forward(self, minibatch: dict[str, torch.Tensor], inputs: dict[str, torch.Tensor]):
        algorithm = self.algorithm
        with algorithm.bound_loss_inputs(inputs):
            stats: dict[str, torch.Tensor] = {}
            loss = sum_terms(algorithm.phase_terms(self.phase, minibatch, stats))
        return loss, ({**stats, "loss": loss.detach()} if self.phase.logs_loss else stats)


def gradient_and_stats(loss: Callable, flat: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The gradient of loss (a function of the flat parameters returning (loss, stats)) at flat, and its stats.
    Inside torch.func's vmap or a compile trace: torch.func.grad. Called directly (an eager population of one:
    CompiledOnce.on_row_zero), torch.autograd.grad on the same graph: the same numbers without torch.func's
    layer around every operation, which made that eager step 1.6x as long (benchmarks.speed.population_step).
    As torch.func.grad, a loss that does not read the parameters has a zero gradient."""
    if (torch.compiler.is_compiling() or torch.is_inference_mode_enabled()
            or torch._C._functorch.maybe_current_level() is not None):
        return torch.func.grad(loss, has_aux=True)(flat)
    flat = flat.detach().requires_grad_()
    with torch.enable_grad():
        value, stats = loss(flat)
        grad = (torch.autograd.grad(value, flat, allow_unused=True, materialize_grads=True)[0]
                if value.requires_grad else torch.zeros_like(flat))
    return grad, pytree.tree_map(torch.Tensor.detach, stats)


def clip_by_global_norm(grad: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.nn.utils.clip_grad_norm_ on a flat gradient: one norm over every parameter, one common scale."""
    norm = torch.linalg.vector_norm(grad)
    return grad * torch.clamp(max_norm / (norm + 1e-6), max=1.0), norm


def sgd_update(param: torch.Tensor, grad: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """torch.optim.SGD's step without momentum or weight decay: p -= lr * g."""
    return param - lr * grad


def adam_update(param: torch.Tensor, grad: torch.Tensor, state: dict, lr: torch.Tensor, betas: tuple[float, float],
                eps: float) -> tuple[torch.Tensor, dict]:
    """torch.optim.Adam's step (no weight decay, no amsgrad) on a flat parameter, written as tensor ops in torch's
    order: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)."""
    beta1, beta2 = betas
    step = state["step"] + 1
    m = state["exp_avg"] * beta1 + grad * (1 - beta1)
    v = state["exp_avg_sq"] * beta2 + grad * grad * (1 - beta2)
    denom = torch.sqrt(v) / torch.sqrt(1 - beta2 ** step) + eps
    return param - (lr / (1 - beta1 ** step)) * m / denom, {"step": step, "exp_avg": m, "exp_avg_sq": v}


class FlatLayout:
    """Where each named parameter of a policy lives in one flat vector (a seed's row of the population's [S, P])."""

    def __init__(self, policy: nn.Module):
        self.names = [name for name, _ in policy.named_parameters()]
        self.shapes = [tuple(p.shape) for _, p in policy.named_parameters()]
        self.sizes = [math.prod(shape) for shape in self.shapes]

    def unflatten(self, flat: torch.Tensor) -> Params:
        pieces = torch.split(flat, self.sizes)
        return {name: piece.view(shape) for name, piece, shape in zip(self.names, pieces, self.shapes)}

    def flatten(self, policy: nn.Module) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for _, p in policy.named_parameters()])


def pin_code_generator() -> None:
    """Inductor's C++ vector width follows ATen's pinned kernels: where ATEN_CPU_CAPABILITY=avx2 (the suite's
    portable numerics) the compiled program is generated for 256-bit vectors too, so that it computes the same
    numbers on every x86-64 CPU with AVX2, as the eager kernels do."""
    import torch._inductor.config as inductor

    if os.environ.get("ATEN_CPU_CAPABILITY", "").lower() == "avx2":
        inductor.cpp.simdlen = 256


ISA_RECORD_PREFIX = "vector_isas_proved_"  # the record's file name in inductor's cache, before its key


def probe_vector_isas_once() -> None:
    """Inductor proves each vector instruction set the CPU reports (AVX2, AVX-512) by compiling a probe and loading
    it in a child Python, in every process: about 1 s before its first compile. The outcome depends on the CPU, the
    compiler and torch, so once every reported set passed it is recorded beside inductor's cache, and a process
    that finds the record skips those probes (config.cpp.vec_isa_ok; the checks of extra features such as VNNI,
    AVX512-BF16 and AMX still run, a few tenths of a second; benchmarks/speed/startup.py measures the saving). The
    instruction set picked, and so every kernel, is the one the probe passes. On any other outcome (a set that
    failed, no compiler, another platform or torch) inductor probes as it always does."""
    import hashlib
    import json
    import platform
    import shutil

    try:
        import torch._inductor.config as inductor
        from torch._inductor import cpu_vec_isa
        from torch._inductor.cpp_builder import get_compiler_version_info, get_cpp_compiler
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        if inductor.cpp.vec_isa_ok is not None or platform.machine() not in ("x86_64", "AMD64"):
            return
        cpu_reports = cpu_vec_isa.x86_isa_checker()
        reported = [str(isa) for isa in cpu_vec_isa.supported_vec_isa_list
                    if all(flag in cpu_reports for flag in str(isa).split())]
        found = shutil.which(get_cpp_compiler())
        if found is None or not reported:
            return
        compiler = os.path.realpath(found)
        facts = [torch.__version__, compiler, os.stat(compiler).st_mtime_ns, get_compiler_version_info(compiler),
                 reported]
        key = hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:16]
        record = os.path.join(cache_dir(), ISA_RECORD_PREFIX + key)
        if not os.path.exists(record):
            if [str(isa) for isa in cpu_vec_isa.valid_vec_isa_list()] != reported:  # the probe itself
                return
            with open(record, "w") as file:
                json.dump(facts, file)
    except (OSError, RuntimeError, AttributeError, ImportError):  # a cache not writable, a compiler not runnable
        return
    # set whether the record was just written or read: inductor's cache keys include it, so every process shares them
    inductor.cpp.vec_isa_ok = True


def compile_mode() -> str:
    """`compiled` unless POPULATION_COMPILE=0 or no C++ compiler is found (then eager, said once in one line)."""
    if os.environ.get("POPULATION_COMPILE", "1") == "0":
        return "eager"
    import shutil

    if not any(shutil.which(name) for name in ("c++", "g++", "clang++")):
        print("note: no C++ compiler found: the population step runs eager (the same numbers up to rounding, "
              "slower)", file=sys.stderr)
        return "eager"
    pin_code_generator()
    probe_vector_isas_once()
    return "compiled"


def remove_damaged_cache_file(error: Exception) -> bool:
    """If `error` is the loader refusing a compiled kernel of inductor's on-disk cache (an empty or cut file), remove
    that file, say so in one line and return True: the next compile builds it again. Any other error: False."""
    import re

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    messages, cause = [str(error)], error.__cause__ or error.__context__
    while cause is not None and len(messages) < 20:  # the chain of exceptions that led to it
        messages.append(str(cause))
        cause = cause.__cause__ or cause.__context__
    message = "\n".join(messages)
    match = re.search(r"(/\S+\.so): (?:file too short|invalid ELF header)", message)
    if match is None:
        return False
    damaged, cache = os.path.realpath(match.group(1)), os.path.realpath(cache_dir())
    if os.path.commonpath([damaged, cache]) != cache or not os.path.isfile(damaged):
        return False
    os.remove(damaged)
    print(f"note: the compile cache held a damaged kernel ({damaged}): removed, compiling it again", file=sys.stderr)
    return True


class CompiledOnce:
    """torch.vmap(one_seed) over the leading seed axis of every argument, torch.compile'd on its first call and
    never again: a later recompilation (a guard that failed) raises instead of silently compiling anew or, past
    dynamo's limit, running eager with other rounding. Eager, a population of one calls one_seed itself on row 0:
    vmap's cost per operation buys nothing for one seed (its act does not come here: PopulationBatch.policy_outputs).

    Guards: before each call dynamo checks what the program was compiled for (input shapes and dtypes, Python
    values it read) - measured here at 25-50 us, as much as the whole act program for one seed. Inside
    `unchecked_calls` (a rollout, an update) only the block's first call of each program checks them, and the
    others skip the check: the shapes are fixed for the whole run by construction (padded minibatches, one
    rollout size), and a per-seed number the loss reads enters as a tensor (loss_inputs), so what the first call
    checked holds for the block. Those later calls also skip dynamo's frame where it only passes the arguments to
    the compiled graph (direct_call): the same kernels, without the frame's cost.
    """

    def __init__(self, one_seed: Callable, mode: str):
        self.graphs: list = []  # (compiled graph, the inputs it was compiled with), one per graph dynamo compiles
        self.one_seed = one_seed
        fn = torch.func.vmap(one_seed, randomness="error")
        self.fn = torch.compile(fn, dynamic=False, backend=self.inductor) if mode == "compiled" else fn
        self.mode, self.called, self.checked_in_block = mode, False, False
        self.direct: Callable | None = None  # the compiled graph called without dynamo's frame (direct_call)

    def inductor(self, graph, example_inputs):
        """torch.compile's own inductor backend with COMPILE_OPTIONS (the same kernels as
        torch.compile(fn, options=COMPILE_OPTIONS)), keeping the compiled graph for direct_call."""
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(graph, example_inputs, config_patches=dict(COMPILE_OPTIONS))
        self.graphs.append((compiled, list(example_inputs)))
        return compiled

    def __call__(self, *args):
        if self.mode != "compiled":
            return self.fn(*args) if len(args[0]) > 1 else self.on_row_zero(args)
        if not self.called:
            self.called = self.checked_in_block = True
            with torch.compiler.set_stance("default"):  # compiles (and records its guards)
                try:
                    result = self.fn(*args)
                except Exception as error:  # a damaged compile cache entry fails every later run until removed
                    if not remove_damaged_cache_file(error):
                        raise
                    result = self.fn(*args)
            self.direct = direct_call(self.graphs, args, result)
            self.graphs.clear()  # the first call's tensors are not kept for the run's life
            return result
        if UncheckedCalls.active and self.checked_in_block:
            if self.direct is not None:
                return self.direct(args)  # the graph itself: no frame, no guards
            return self.fn(*args)  # the block's stance: guards skipped
        self.checked_in_block = True
        with torch.compiler.set_stance("fail_on_recompile"):
            return self.fn(*args)

    def on_row_zero(self, args: tuple):
        """one_seed on row 0 of every argument, its results given back their seed axis (as vmap returns them)."""
        result = self.one_seed(*pytree.tree_map(lambda tensor: tensor[0], args))
        return pytree.tree_map(lambda tensor: tensor.unsqueeze(0), result)


def direct_call(graphs: list, args: tuple, result) -> Callable | None:
    """The compiled graph as a plain function of the program's arguments, or None where dynamo's frame does more
    than call it. Dynamo's frame around a compiled graph costs more than the graph itself for the act program of
    one seed (tens of us per env step); inside `unchecked_calls` it only passes the arguments on and packs the
    outputs, which this does directly. Taken only when the program is one graph whose inputs are the call's own
    tensors (arguments, or values of arguments that are dicts: nothing the frame reads from elsewhere, such as an
    attribute), whose result is a tuple of tensors and dicts of tensors, and whose outputs, recomputed from copies
    of those inputs, equal the frame's result exactly, in its order. Where each input sits among the arguments
    and how the outputs pack into the result are found here, once: a walk of both structures on every call
    (pytree's) cost about a fifth of the act program's call for one seed."""
    if len(graphs) != 1 or type(result) is not tuple:
        return None
    compiled, example_inputs = graphs[0]
    where = {}  # id of each tensor of the arguments -> (position, ()) for an argument, (position, (key,)) in a dict
    for position, argument in enumerate(args):
        for path, value in ([((key,), value) for key, value in argument.items()] if isinstance(argument, dict)
                            else [((), argument)]):
            if isinstance(value, torch.Tensor):
                where[id(value)] = (position, path)
    if not all(id(tensor) in where for tensor in example_inputs):
        return None
    picks = [where[id(tensor)] for tensor in example_inputs]
    if not all(isinstance(part, torch.Tensor) or isinstance(part, dict) and all(
            isinstance(value, torch.Tensor) for value in part.values()) for part in result):
        return None
    parts = [list(part) if isinstance(part, dict) else None for part in result]  # a dict's keys; None: a tensor

    def inputs_of(arguments: tuple) -> list:
        return [arguments[position][path[0]] if path else arguments[position] for position, path in picks]

    def packed(outputs) -> tuple:
        outputs = iter(outputs)
        return tuple(next(outputs) if keys is None else {key: next(outputs) for key in keys} for keys in parts)

    expected, spec = pytree.tree_flatten(result)
    outputs = compiled(*[tensor.clone() for tensor in inputs_of(args)])
    if not (isinstance(outputs, (list, tuple)) and len(outputs) == len(expected) and all(
            isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.dtype == want.dtype
            and torch.equal(got, want) for got, want in zip(outputs, expected))):
        return None
    if pytree.tree_structure(packed(outputs)) != spec:
        return None

    def call(arguments: tuple):
        return packed(compiled(*inputs_of(arguments)))

    return call


class UncheckedCalls:
    """The block of `unchecked_calls`: programs' guards checked once on entry, skipped after (CompiledOnce)."""

    active = False

    def __init__(self, programs: list[CompiledOnce]):
        self.programs = programs

    def __enter__(self):
        for program in self.programs:
            program.checked_in_block = False
        self.previous = torch.compiler.set_stance("default", skip_guard_eval_unsafe=True).prev  # set until exit
        self.was_active, UncheckedCalls.active = UncheckedCalls.active, True
        return self

    def __exit__(self, *exc):
        UncheckedCalls.active = self.was_active
        previous = self.previous
        torch.compiler.set_stance(previous.stance, skip_guard_eval_unsafe=previous.skip_guard_eval_unsafe,
                                  force_backend=previous.backend)


class PopulationStep:
    """The vmapped (and compiled) minibatch step of one phase of an algorithm config (PPO.update_phases) over S
    seeds.

    `template` is any algorithm object of the population: its class's loss code is traced with the seed's
    parameters substituted (functional_call), so it must hold nothing per seed that the loss reads except
    through loss_inputs. The phase's optimizer may own only some of the policy's parameters (Outer-PPO's full-batch
    inner loop steps the actor, its critic's fit the critic): the others keep their values and get no moments.
    """

    def __init__(self, template, phase, mode: str | None = None):
        # A shallow copy (the same policy module and config): the loss inputs it is traced with are set on the copy
        # only, so the run's own objects (whose PPO-KL beta adapts every update) are never read by the compiled
        # program's guards; a guard on a changing Python number would recompile, and past the recompile limit
        # fall back to eager, changing the rounding mid-run.
        self.module = LossModule(copy.copy(template), phase)
        self.layout = FlatLayout(template.policy)
        optimizer = getattr(template, phase.optimizer)
        group = optimizer.param_groups[0]
        self.max_grad_norm, self.steps_adam = phase.max_grad_norm, type(optimizer) is torch.optim.Adam
        self.betas, self.eps = (tuple(group["betas"]), float(group["eps"])) if self.steps_adam else (None, None)
        self.settings = optimizer_settings(optimizer)  # what the program steps, in words
        # [P]: True on the parameters the phase's optimizer steps; None when it steps them all
        self.owned = owned_mask(optimizer, template.policy)
        self.mode = mode or compile_mode()
        self.step = CompiledOnce(self.one_seed, self.mode)
        self.lrs, self.lr_tensor = None, None
        self.reads: list[str] | None = None  # the object's own values its loss reads, found at the first update

    def refuse_stale_reads(self, algorithms: list, active: list[bool], batch: dict) -> None:
        """The program runs the loss on the object it was built from (a copy of the first seed's, made with the
        population): a number, flag, string or tensor of the object that the loss reads, other than its loss_inputs,
        must be what every running seed holds at this update, or every seed would train on the copy's value without
        a word (a coefficient the algorithm anneals, a value that differs between seeds). Raises LossReadError
        naming the first that differs."""
        held_by_program = self.module.algorithm
        if self.reads is None:
            given = set(held_by_program.loss_inputs())
            reader = next(algorithm for algorithm, on in zip(algorithms, active) if on)
            self.reads = [name for name in attributes_the_loss_reads(reader, self.module.phase, batch)
                          if name not in given]
        for name in self.reads:
            held = getattr(held_by_program, name, MISSING)
            for index, (algorithm, on) in enumerate(zip(algorithms, active)):
                value = getattr(algorithm, name, MISSING)
                if on and not same_value(value, held):
                    now, then = described(value), described(held)
                    raise LossReadError(
                        f"{type(algorithm).__name__}'s loss ({self.module.phase.loss}) reads self.{name}, which the "
                        f"population's seed {index} (by position) holds as {now} where the population's program "
                        f"reads {then}{' of other values' if now == then else ''} (the first seed's when the "
                        f"population was built): a number or tensor the loss reads that changes during training or "
                        f"differs between seeds goes to the loss through loss_inputs (each seed's own, at every "
                        f"update); for another value, declare population_update = \"per_seed\" in the class")

    def refuse_other_optimizer_settings(self, optimizers: list, active: list[bool]) -> None:
        """The program steps every seed with the optimizer settings it was built with, the first seed's optimizer's
        when the population was built (only the learning rate is each seed's own, at each update): a running seed's
        optimizer that now holds other betas or eps, or settings the program does not compute (a weight decay set
        since), would step as the program does without a word. Raises LossReadError naming the first."""
        for index, (optimizer, on) in enumerate(zip(optimizers, active)):
            held = optimizer_settings(optimizer)
            if not on or held == self.settings:
                continue
            raise LossReadError(
                f"the population's seed {index} (by position) holds {held} as its {self.module.phase.optimizer} where "
                f"the population's program steps {self.settings} (the first seed's when the population was built): "
                f"optimizer settings that change during training or differ between seeds other than the learning "
                f"rate (begin_update's) need their own update, seed by seed: declare population_update = "
                f"\"per_seed\" in the class")

    def one_seed(self, flat: torch.Tensor, moments: dict, minibatch: dict, lr: torch.Tensor, active: torch.Tensor,
                 inputs: dict, buffers: dict):
        def loss(parameters: torch.Tensor):
            named = {f"policy.{name}": value for name, value in (self.layout.unflatten(parameters) | buffers).items()}
            return torch.func.functional_call(self.module, named, (minibatch, inputs))

        grad, stats = gradient_and_stats(loss, flat)
        if self.owned is not None:  # the norm and the step see the phase's own parameters only
            grad = torch.where(self.owned, grad, 0.0)
        if self.max_grad_norm is not None:
            grad, stats["grad_norm"] = clip_by_global_norm(grad, self.max_grad_norm)
        if self.steps_adam:
            new_flat, new_moments = adam_update(flat, grad, moments, lr, self.betas, self.eps)
        else:  # plain SGD keeps no state
            new_flat, new_moments = sgd_update(flat, grad, lr), {}
        # a stopped seed keeps its parameters and moments exactly (Adam would move it on a zero gradient), and so
        # does every parameter the phase does not own
        moves = active if self.owned is None else active & self.owned
        new_flat = torch.where(moves, new_flat, flat)
        new_moments = {key: torch.where(active if key == "step" else moves, value, moments[key])
                       for key, value in new_moments.items()}
        return new_flat, new_moments, stats

    def __call__(self, flat: torch.Tensor, moments: dict, minibatch: dict, lrs: list[float], active: torch.Tensor,
                 inputs: dict, buffers: dict):
        if lrs != self.lrs:  # [S]: one tensor per update's learning rates, not one per minibatch
            self.lrs, self.lr_tensor = list(lrs), torch.tensor(lrs, dtype=torch.float32)
        return self.step(flat, moments, minibatch, self.lr_tensor, active, inputs, buffers)


def as_loss_input(value) -> torch.Tensor:
    """A seed's loss input as the program takes it: a number as a float32 scalar, a tensor as it is (a copy)."""
    return value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)


def loss_input_tensors(algorithm) -> dict[str, torch.Tensor]:
    """One seed's loss inputs as the program takes them (as_loss_input), by name."""
    return {name: as_loss_input(value) for name, value in algorithm.loss_inputs().items()}


def module_values(policy: nn.Module) -> dict:
    """The numbers, flags, strings and tensors a policy's modules hold as plain attributes (not parameters or
    buffers), by module.attribute; tensors copied."""
    return {f"{prefix}.{key}" if prefix else key: value.clone() if isinstance(value, torch.Tensor) else value
            for prefix, module in policy.named_modules() for key, value in vars(module).items()
            if not key.startswith("_") and isinstance(value, OWN_VALUE_TYPES)}


def buffer_values(policy: nn.Module) -> dict[str, torch.Tensor]:
    """A copy of each buffer of the policy, by name."""
    return {name: buffer.clone() for name, buffer in policy.named_buffers()}


def owner_of(policy: nn.Module, name: str) -> tuple[nn.Module, str]:
    """The module holding `name` (module.attribute) and the attribute's name in it."""
    path, _, attribute = name.rpartition(".")
    return policy.get_submodule(path), attribute


def class_value(policy: nn.Module, name: str):
    """What the class of the module at `name` (module.attribute) gives for the attribute: MISSING if nothing."""
    module, attribute = owner_of(policy, name)
    return getattr(type(module), attribute, MISSING)


def stack_parameters(policies: list[nn.Module]) -> torch.Tensor:
    """[S, P]: row i is seed i's parameters, flat, in named_parameters order."""
    layout = FlatLayout(policies[0])
    return torch.stack([layout.flatten(policy) for policy in policies])


def owned_mask(optimizer: torch.optim.Optimizer, policy: nn.Module) -> torch.Tensor | None:
    """[P] (flat layout): True on the parameters the optimizer steps; None when it steps every one."""
    owned = {id(parameter) for parameter in stepped_parameters(optimizer)}
    pieces = [torch.full((param.numel(),), id(param) in owned) for param in policy.parameters()]
    mask = torch.cat(pieces)
    return None if bool(mask.all()) else mask


def adam_state_from(optimizers: list[torch.optim.Optimizer], policies: list[nn.Module]) -> dict:
    """The population's Adam state ([S] steps, [S, P] moments) from the seeds' own torch Adam optimizers (zero
    moments on a parameter an optimizer does not step)."""
    rows = []
    for optimizer, policy in zip(optimizers, policies):
        owned = {id(parameter) for parameter in stepped_parameters(optimizer)}
        states = [optimizer.state.get(param, {}) if id(param) in owned else None for param in policy.parameters()]
        if not all(state for state in states if state is not None):  # before the first step
            return {"step": torch.zeros(len(policies)), "exp_avg": torch.zeros(len(policies), rows_size(policy)),
                    "exp_avg_sq": torch.zeros(len(policies), rows_size(policy))}
        step = next(float(state["step"]) for state in states if state is not None)
        moments = [torch.cat([(state[key] if state is not None else torch.zeros_like(param)).reshape(-1)
                              for state, param in zip(states, policy.parameters())]) for key in ("exp_avg", "exp_avg_sq")]
        rows.append((step, *moments))
    return {"step": torch.tensor([row[0] for row in rows]), "exp_avg": torch.stack([row[1] for row in rows]),
            "exp_avg_sq": torch.stack([row[2] for row in rows])}


def rows_size(policy: nn.Module) -> int:
    return sum(p.numel() for p in policy.parameters())


def adam_state_to(adam: dict, optimizers: list[torch.optim.Optimizer], policies: list[nn.Module]) -> None:
    """Row i of the population's Adam state into seed i's torch Adam (what its checkpoint records)."""
    for index, (optimizer, policy) in enumerate(zip(optimizers, policies)):
        if float(adam["step"][index]) == 0:
            continue
        layout = FlatLayout(policy)
        exp_avg, exp_avg_sq = layout.unflatten(adam["exp_avg"][index]), layout.unflatten(adam["exp_avg_sq"][index])
        owned = {id(parameter) for parameter in stepped_parameters(optimizer)}
        for name, param in policy.named_parameters():
            if id(param) not in owned:
                continue
            optimizer.state[param] = {"step": adam["step"][index].clone().reshape(()),
                                      "exp_avg": exp_avg[name].clone(), "exp_avg_sq": exp_avg_sq[name].clone()}


def parameters_to(flat: torch.Tensor, policies: list[nn.Module]) -> None:
    """Row i of the population's parameters into seed i's policy (acting, evaluation and checkpoints read it)."""
    with torch.no_grad():
        for row, policy in zip(flat, policies, strict=True):
            parameters = list(policy.parameters())  # named_parameters order: the flat layout's
            for parameter, value in zip(parameters, torch.split(row, [parameter.numel() for parameter in parameters])):
                parameter.copy_(value.view_as(parameter))


# ---------------------------------------------------------------------------
# The population: S seeds' algorithms acting and learning together
# ---------------------------------------------------------------------------


class PopulationBatch:
    """S algorithm objects of one config (one per seed) acting in one call and, when their class's
    population_update is "vectorized", updating in one compiled program (PopulationStep).

    The per-seed objects stay the record: evaluation acts with seed i's own policy, checkpoints hold seed i's own
    networks and optimizer state; the population's [S, P] parameters and Adam state are copied into them after
    every update (parameters) and before every checkpoint (optimizer_to_seeds), and read back from them after a
    resume (optimizer_from_seeds). Each seed draws its action noise and minibatch permutations from its own
    generator (randoms[i].torch), in the order a population of one draws them.
    """

    def __init__(self, algorithms: list, randoms: list, mode: str | None = None):
        refuse_what_it_cannot_run(algorithms)  # before anything of torch's is reset or set
        self.algorithms, self.randoms = algorithms, randoms
        first = algorithms[0]
        self.policies = [algorithm.policy for algorithm in algorithms]
        # what else of the policy its forward may read (plain attributes of its modules): seed 0's, as both programs
        # run seed 0's module, so it must be every seed's, for the whole run (refuse_policy_values_that_differ)
        self.policy_values = module_values(first.policy)
        self.refuse_policy_values_that_differ([True] * len(algorithms))  # before a rollout acts on them
        self.layout = FlatLayout(first.policy)
        self.discrete = first.policy.discrete
        self.mode = mode or compile_mode()
        if self.mode == "compiled":
            # Dynamo keys its compiled programs by code object: a second population in this process (a sweep's
            # next job, a benchmark's next run) would count as recompiles of the first's functions, and past
            # dynamo's limit run them eager. One population trains at a time: its programs start afresh (the
            # inductor's cache on disk still makes their compilation fast), and a limit hit raises, never falls back.
            torch._dynamo.reset()
            torch._dynamo.config.fail_on_recompile_limit_hit = True
        self.params = stack_parameters(self.policies)
        # the policy's buffers (tensors a module holds that are not parameters: a fixed projection, a mask): none
        # in PPO's policy; a variant's are each seed's own in both programs, which read them and never write them
        self.buffer_names = [name for name, _ in first.policy.named_buffers()]
        # (module, attribute) of each buffer in each seed's policy, found once: read at every act call
        self.buffer_owners = [[owner_of(policy, name) for policy in self.policies] for name in self.buffer_names]
        self.draws, self.slabs = None, []  # [seeds, envs, width]: each act call's noise, allocated by noise()
        self.vectorized = first.population_update == "vectorized"  # declared by the algorithm (per instance)
        self.acting = CompiledOnce(self.act_one_seed, self.mode)
        if self.vectorized:
            self.phases = first.update_phases()  # PPO: one; Outer-PPO's full-batch inner loop: two
            self.steps = [PopulationStep(first, phase, mode=self.mode) for phase in self.phases]
            # each optimizer's Adam state, [S] steps and [S, P] moments, by the attribute naming it; SGD keeps none
            self.moments = {phase.optimizer: adam_state_from([getattr(a, phase.optimizer) for a in algorithms],
                                                             self.policies) if step.steps_adam else {}
                            for phase, step in zip(self.phases, self.steps)}

    def __len__(self) -> int:
        return len(self.algorithms)

    def unchecked_calls(self) -> UncheckedCalls:
        """A block (a rollout, an update) in which each compiled program checks its guards on its first call only."""
        return UncheckedCalls([self.acting] + ([step.step for step in self.steps] if self.vectorized else []))

    # -- acting -----------------------------------------------------------------

    def seed_buffers(self) -> dict[str, torch.Tensor]:
        """Each buffer as [S, ...], row i read from seed i's module now (the algorithm may have changed it)."""
        return {name: torch.stack([getattr(module, attribute) for module, attribute in owners])
                for name, owners in zip(self.buffer_names, self.buffer_owners)}

    def act_one_seed(self, flat: torch.Tensor, buffers: dict, obs: torch.Tensor, draws: torch.Tensor):
        return torch.func.functional_call(self.policies[0], self.layout.unflatten(flat) | buffers, (obs, draws))

    def policy_outputs(self, obs: torch.Tensor, draws: torch.Tensor):
        """action, log_prob, value [seeds, envs, ...] of every seed's policy, under the caller's torch.no_grad (the
        module's parameters require grad). Eager, a population of one runs its module itself: between updates the
        module's parameters are the population's row 0 (parameters_to and stack_parameters after every update and
        resume), its buffers are read from it either way, and functional_call's swap of the row into the module
        costs more than the forward itself (python -m benchmarks.speed.population_step --sizes 1)."""
        if self.mode != "compiled" and len(self) == 1:
            return tuple(output.unsqueeze(0) for output in self.policies[0](obs[0], draws[0]))
        return self.acting(self.params, self.seed_buffers(), obs, draws)

    def noise(self, obs: torch.Tensor) -> torch.Tensor:
        """The act program's draws [seeds, envs, width] for observations [seeds, envs, obs_dim] (width: the actor's
        output), allocated on the first act or value call (the program is compiled for one env count: another
        raises)."""
        if self.draws is None or self.draws.shape[1] != obs.shape[1]:
            with torch.no_grad():
                width = self.policies[0].actor(obs[0]).shape[-1]
            self.draws = torch.zeros(len(self), obs.shape[1], width)
            self.slabs = list(zip(self.draws, self.randoms))
        return self.draws

    def act(self, obs: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [seeds, envs, obs_dim] -> action, log_prob, value of every seed (numpy, for the envs). A stopped
        seed (active False) acts too, harmlessly: its parameters are frozen and its envs are not stepped."""
        obs = torch.from_numpy(obs)
        draws = self.noise(obs)
        for slab, randoms in self.slabs:  # each seed's draws from its own generator, refilled every call
            if self.discrete:
                slab.exponential_(1, generator=randoms.torch)
            else:
                slab.normal_(generator=randoms.torch)
        with torch.no_grad():
            action, log_prob, value = self.policy_outputs(obs, draws)
        return action.numpy(), log_prob.numpy(), value.numpy()

    def value(self, obs: np.ndarray) -> np.ndarray:
        """V(obs) of every seed (the bootstrap after a rollout): the act program's value output, on draws left as
        they were (no stream moves; the action it also computes is not used), so that one program serves both."""
        with torch.no_grad():
            obs = torch.from_numpy(obs)
            return self.policy_outputs(obs, self.noise(obs))[2].numpy()

    # -- learning -----------------------------------------------------------------

    def refuse_policy_values_that_differ(self, active: list[bool]) -> None:
        """Both programs run seed 0's policy module with each seed's parameters and buffers: a plain attribute of its
        modules that the forward may read (a number, flag, string or tensor, not registered as a buffer) must be
        what it was when the population was built, in every running seed. Raises LossReadError naming the first
        that is not."""
        for index, (policy, on) in enumerate(zip(self.policies, active)):
            for name, value in (module_values(policy).items() if on else ()):
                # an attribute the first seed's module did not hold itself: its class's, if any
                held = self.policy_values[name] if name in self.policy_values else class_value(self.policies[0], name)
                if not same_value(value, held):
                    raise LossReadError(
                        f"{type(self.algorithms[index]).__name__}'s policy holds {name} as {described(value)} in the "
                        f"population's seed {index} (by position) where its programs read {described(held)} (the "
                        f"first seed's when the population was built): a value the policy reads that changes during "
                        f"training or differs between seeds goes in a buffer (register_buffer), which the programs "
                        f"read as each seed's own; for another value, train with algo.backend=torch (each seed's own "
                        f"code)")

    def update(self, rollouts: list, iteration: int, active: list[bool]) -> list[dict | None]:
        """Each active seed's statistics of this update (None for a seed that stopped)."""
        if self.vectorized:  # checks them after the seeds' begin_update, whose values its steps read
            return self.vectorized_update(rollouts, iteration, active)
        self.refuse_policy_values_that_differ(active)  # as the rollout read them
        stats = each_seed_update(self.algorithms, self.randoms, rollouts, iteration, active)
        self.params = stack_parameters(self.policies)
        return stats

    def vectorized_update(self, rollouts: list, iteration: int, active: list[bool]) -> list[dict | None]:
        """PPO.update for every seed at once: each active seed's begin_update (its own code: Outer-PPO's theta_k,
        HP3O's buffer), each of the algorithm's phases (PPO's epochs x minibatches) as one program over each
        seed's own epoch batches (drawn from its own streams), then each seed's after_epochs and end_update
        (Outer-PPO's outer step)."""
        algorithms = self.algorithms
        batches, lrs, lead = [], [], None
        for algorithm, rollout, randoms, on in zip(algorithms, rollouts, self.randoms, active):
            batches.append(algorithm.flatten_rollout(rollout))
            lr = None
            if on:
                with randoms:
                    lr = learning_rate_from(algorithm, rollout, batches[-1], iteration)  # the seed's own schedule
                lead = lead or algorithm
            lrs.append(lr)
        if lead is None:  # no seed is running
            return [None] * len(algorithms)
        last = next(lr for lr in reversed(lrs) if lr is not None)
        lrs = [last if lr is None else lr for lr in lrs]  # a stopped seed's: never stepped
        for algorithm, lr in zip(algorithms, lrs):
            algorithm.set_lr(algorithm.optimizer, lr)  # what the seed's checkpoint records
        self.params = stack_parameters(self.policies)  # begin_update may have moved a seed (a biased start)
        buffers = self.seed_buffers()  # as begin_update left them
        self.refuse_policy_values_that_differ(active)  # as the rollout read them, and begin_update left them
        seed_inputs = [loss_input_tensors(algorithm) for algorithm in algorithms]
        inputs = {name: torch.stack([seed[name] for seed in seed_inputs]) for name in lead.loss_inputs()}
        reading = next(batch for batch, on in zip(batches, active) if on)
        for step in self.steps:
            step.refuse_stale_reads(algorithms, active, reading)
        rollout_size = rollouts[0].num_steps * rollouts[0].num_envs
        phase_means, trained_on = [], None
        for phase, step in zip(self.phases, self.steps):
            optimizers = [getattr(algorithm, phase.optimizer) for algorithm in algorithms]
            step.refuse_other_optimizer_settings(optimizers, active)
            phase_lrs = [optimizer.param_groups[0]["lr"] for optimizer in optimizers]
            means, trained_on = self.run_phase(phase, step, batches, active, inputs, buffers, phase_lrs,
                                               rollout_size)
            phase_means.append(means)
        if not lead.runs_ppo_epochs():  # explained variance over the epochs' batches is PPO's epoch loop's only
            trained_on = None
        parameters_to(self.params, self.policies)
        from algorithms.ppo import explained_variance, in_log_order

        results = []
        for index, (algorithm, batch, on) in enumerate(zip(algorithms, batches, active)):
            if not on:
                results.append(None)
                continue
            stats = {}
            for means in phase_means:
                stats |= in_log_order({key: float(value[index]) for key, value in means.items()})
            if trained_on is not None:
                stats["explained_variance"] = explained_variance(torch.cat([b["values"] for b in trained_on[index]]),
                                                                 torch.cat([b["returns"] for b in trained_on[index]]))
            with self.randoms[index]:
                stats |= algorithm.after_epochs(batch)
                stats["lr"] = lrs[index]
                results.append(algorithm.end_update(batch, iteration, stats))
        self.params = stack_parameters(self.policies)  # end_update may have moved them (an outer step)
        return results

    def run_phase(self, phase, step: PopulationStep, batches: list, active: list[bool], inputs: dict,
                  buffers: dict, lrs: list, rollout_size: int):
        """One phase for every seed: its epochs (the seed's own epoch_batches, or the batch `phase.epochs` times),
        each cut into the seed's own minibatches (shuffled from the seed's generator, or the whole batch in its
        order), one program call per minibatch. Returns each statistic's mean over the steps each seed took
        ([S] tensors) and the batches each seed trained on."""
        algorithms, first = self.algorithms, self.algorithms[0]
        width = rollout_size if phase.whole_batch else first.minibatch_rows_at_most(rollout_size)
        # PPO's target-KL stop (PPO.run_epochs), in PPO's own epochs only: each seed ends its epochs after the
        # first whose last minibatch's approx KL exceeds algo.target_kl, and the others go on
        target_kl = first.cfg.target_kl if first.runs_ppo_epochs() else None
        epoch_iterators = []
        for algorithm, batch, randoms, on in zip(algorithms, batches, self.randoms, active):
            if not on:
                epoch_iterators.append(None)
                continue
            with randoms:  # a variant may draw its epochs' batches as it makes them
                epoch_iterators.append(algorithm.phase_epoch_batches(phase, batch))
        running = torch.tensor(active)
        trained_on = [[] for _ in algorithms]
        per_step, stepped = [], []
        while True:
            epoch, training = [], []
            for index, epochs in enumerate(epoch_iterators):
                drawn = None
                if epochs is not None:
                    with self.randoms[index]:
                        drawn = next(epochs, None)  # None: this seed's epochs are over (as run_epochs would stop)
                training.append(drawn is not None)
                epoch.append(drawn if drawn is not None else batches[index])  # a stopped seed: rows, never stepped
                if drawn is not None:
                    trained_on[index].append(drawn)
            if not any(training):
                break
            counts = [batch["obs"].shape[0] for batch in epoch]
            splits = [(1 if phase.whole_batch else a.num_minibatches(count)) if on else 0
                      for a, count, on in zip(algorithms, counts, training)]
            # [seeds, rows] of every loss key, each seed's valid rows first (the rest never read unmasked)
            largest = max(counts)
            stacked = {key: torch.stack([pad_rows(batch[key], largest) for batch in epoch]) for key in first.loss_keys}
            rows, mask = minibatch_rows(counts, splits, width, self.randoms, shuffled=not phase.whole_batch)
            # the epoch's minibatches gathered at once, [minibatches, seeds, width, ...]: minibatch m is slab m
            gathered = {key: gather_minibatches(value, rows).unbind(0) for key, value in stacked.items()}
            # a seed with fewer minibatches this epoch is done after its own
            stepping = (running & (torch.arange(len(rows))[:, None] < torch.tensor(splits))).unbind(0)
            for m, minibatch_mask in enumerate(mask.unbind(0)):
                minibatch = {key: slabs[m] for key, slabs in gathered.items()}
                minibatch[MASK] = minibatch_mask
                self.params, self.moments[phase.optimizer], stats = step(
                    self.params, self.moments[phase.optimizer], minibatch, lrs, stepping[m], inputs, buffers)
                per_step.append(stats)
                stepped.append(stepping[m])
            if target_kl is not None:
                epoch_steps = per_step[-len(stepping):]
                for index, split in enumerate(splits):
                    if split and float(epoch_steps[split - 1]["approx_kl"][index]) > target_kl:
                        epoch_iterators[index] = None  # no further epoch batch is drawn, as after PPO's break
        return step_means(per_step, torch.stack(stepped, dim=1)), trained_on

    def optimizer_from_seeds(self) -> None:
        """Parameters and Adam state from the seeds' own objects (after they loaded a checkpoint)."""
        self.params = stack_parameters(self.policies)
        if self.vectorized:
            for phase, step in zip(self.phases, self.steps):
                if step.steps_adam:
                    self.moments[phase.optimizer] = adam_state_from(
                        [getattr(a, phase.optimizer) for a in self.algorithms], self.policies)

    def optimizer_to_seeds(self) -> None:
        """Each seed's optimizer state = its row of the population's (before its checkpoint is written)."""
        if self.vectorized:
            for phase, step in zip(self.phases, self.steps):
                if step.steps_adam:
                    adam_state_to(self.moments[phase.optimizer], [getattr(a, phase.optimizer) for a in self.algorithms],
                                  self.policies)


def each_seed_update(algorithms: list, randoms: list, rollouts: list, iteration: int, active: list[bool]) -> list:
    """Each active seed's own algorithm.update, inside its own random streams (None for a seed that stopped)."""
    stats = []
    for algorithm, streams, rollout, on in zip(algorithms, randoms, rollouts, active):
        with streams:
            stats.append(algorithm.update(rollout, iteration) if on else None)
    return stats


class EagerPopulation:
    """algo.backend=torch: each seed's own algorithm code run eagerly - its act, value and update, called as a
    plain script calls them - behind PopulationBatch's interface, so that one training loop drives both. For
    what the compiled program does not run (the token tasks' language-model policies) and for runs that must
    equal torch.optim's own numbers bit for bit."""

    mode = "eager"

    def __init__(self, algorithms: list, randoms: list):
        self.algorithms, self.randoms = algorithms, randoms

    def __len__(self) -> int:
        return len(self.algorithms)

    def unchecked_calls(self):
        return contextlib.nullcontext()  # nothing compiled, no guards

    def act(self, obs: np.ndarray, active: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """obs [seeds, envs, ...] -> action, log_prob, value of every seed, each from its own policy and streams.
        A stopped seed (active False; its numbers went non-finite) does not act: its rows are zeros."""
        per_seed: list = [None] * len(self)
        for index, (algorithm, streams, seed_obs) in enumerate(zip(self.algorithms, self.randoms, obs)):
            if active[index]:
                with streams, torch.inference_mode():
                    per_seed[index] = [column.numpy() for column in algorithm.act(torch.from_numpy(seed_obs))]
        acting = next(columns for columns in per_seed if columns is not None)
        per_seed = [columns or [np.zeros_like(column) for column in acting] for columns in per_seed]
        action, log_prob, value = (np.stack(column) for column in zip(*per_seed))
        return action, log_prob, value

    def value(self, obs: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return np.stack([algorithm.value(torch.from_numpy(seed_obs)).numpy()
                             for algorithm, seed_obs in zip(self.algorithms, obs)])

    def update(self, rollouts: list, iteration: int, active: list[bool]) -> list[dict | None]:
        return each_seed_update(self.algorithms, self.randoms, rollouts, iteration, active)

    def optimizer_from_seeds(self) -> None:
        """Nothing to read: the seeds' own objects are the state."""

    def optimizer_to_seeds(self) -> None:
        """Nothing to write: the seeds' own objects are the state."""


# PPO's methods whose code the vectorized update does not run (it runs the algorithm's phases - their evaluation
# and loss terms -, flatten_rollout, epoch_batches, num_minibatches, after_epochs and the hooks around the epochs,
# and steps Adam or SGD itself).
UPDATE_LOOP_METHODS = ("update", "optimize", "run_epochs", "run_phase", "epoch_minibatches", "minibatch_step",
                       "phase_step")


# The algorithm's methods a population does not call to act: it acts for every seed in one program, with the
# policy's own forward (act_one_seed), and reads the bootstrap value from the same program.
ACTING_METHODS = ("act", "value")


def acting_overrides(cls) -> list[str]:
    """The acting methods a PPO subclass overrides: code a population would not run."""
    from algorithms.ppo import PPO

    return [method for method in ACTING_METHODS if defining_class(cls, method) is not PPO]


def defining_class(cls, name: str) -> type:
    """The class of `cls`'s MRO whose body defines `name`."""
    return next(klass for klass in cls.__mro__ if name in vars(klass))


def declaring_class(cls) -> type:
    """The class whose body says how a population runs `cls`'s update (population_update)."""
    return defining_class(cls, "population_update")


def undeclared_overrides(cls) -> list[str]:
    """The update-loop methods `cls` overrides below the class that declared its population_update: code a
    vectorized population would skip without anyone having said it may (the declaration is the capability)."""
    from algorithms.ppo import PPO

    mro = cls.__mro__
    declarer = declaring_class(cls)
    overridden = []
    for method in UPDATE_LOOP_METHODS:
        definer = defining_class(cls, method)
        if definer is not PPO and mro.index(definer) < mro.index(declarer):  # below it (a mixin's too)
            overridden.append(method)
    return overridden


def population_problems(algorithm) -> list[str]:
    """Why a population cannot run this algorithm object (empty: it can). The vectorized update runs the class's
    phases (their loss terms) and steps Adam or SGD with one parameter group and no weight decay, momentum, amsgrad
    or maximize (what_the_step_does_not_compute), so another optimizer,
    or an override of the update loop the class did not declare with population_update, is refused, never trained
    as PPO; a variant that builds another optimizer, or replaces the update loop, declares "per_seed"."""
    cls = type(algorithm)
    acting = acting_overrides(cls)
    if acting:
        return [f"{cls.__name__} overrides {' and '.join(acting)}: a population acts for its seeds in one program, "
                f"with the policy's own forward, and would not run that code; train it with algo.backend=torch "
                f"(each seed's own code; the default for such a class)"]
    kind = algorithm.population_update
    if kind not in ("vectorized", "per_seed"):
        return [f"{cls.__name__}.population_update must be \"vectorized\" or \"per_seed\", got {kind!r}"]
    if kind == "per_seed":
        return []
    overridden = undeclared_overrides(cls)
    if overridden:
        return [f"{cls.__name__} overrides {', '.join(overridden)}, which the population's vectorized update does "
                f"not run; declare population_update = \"per_seed\" in the class (its own update, seed by seed), "
                f"or \"vectorized\" if the override changes nothing a population must run"]
    policy_parameters = {id(parameter) for parameter in algorithm.policy.parameters()}
    for phase in algorithm.update_phases():
        optimizer = getattr(algorithm, phase.optimizer)
        if any(id(parameter) not in policy_parameters for parameter in stepped_parameters(optimizer)):
            return [f"{cls.__name__}'s {phase.optimizer} steps a parameter outside its policy: the population's "
                    f"vectorized update steps the policy's parameters only; declare population_update = "
                    f"\"per_seed\" in the class"]
        if phase.whole_batch and phase.epochs is None:
            return [f"{cls.__name__}'s phase {phase.loss} takes whole batches from epoch_batches: a population "
                    f"pads a whole batch to the rollout's size only, so give the phase its number of epochs"]
        unstepped = what_the_step_does_not_compute(optimizer)
        if unstepped is not None:
            return [f"{cls.__name__} builds {type(optimizer).__name__}{unstepped}: the population's vectorized "
                    f"update steps Adam or SGD with one parameter group and no weight decay, momentum, amsgrad or "
                    f"maximize only; declare population_update = \"per_seed\" in the class"]
    return []


def loss_problems(algorithm, obs_dim: int, action_shape: tuple) -> list[str]:
    """What in a vectorized algorithm's loss a population would train differently from the eager path, or fail
    on mid-run: a loss key its batch lacks; a term that is not one number; a loss that writes a number, flag,
    string or tensor held on the algorithm object (the compiled program runs that Python once, when traced); a
    loss that draws from torch's, numpy's or Python's global random stream (refused mid-run by the vmapped
    program, or fixed when traced); a term or statistic that changes when its minibatch gains masked padding
    rows, as a population pads each seed's minibatches to one shape - a mean over rows taken without masked_mean,
    which would train the population on the padding. Found on a small random rollout (from a generator of its
    own) through the algorithm's own flatten_rollout and phases; what fails on it is left to the run, which says
    why. The global streams are left as they were."""
    if algorithm.population_update != "vectorized":
        return []
    from algorithms.core import Rollout

    generator = torch.Generator().manual_seed(0)
    rollout = Rollout.allocate(4, 4, obs_dim, action_shape)  # 16 rows: 8 for the minibatch, 8 to pad it with
    for column in (rollout.obs, rollout.actions, rollout.values, rollout.rewards):
        column.normal_(generator=generator)
    rollout.log_probs.copy_(-torch.rand(rollout.log_probs.shape, generator=generator))
    name = type(algorithm).__name__

    def measured(phase, minibatch: dict) -> dict[str, torch.Tensor]:
        stats: dict = {}
        with torch.no_grad():
            terms = algorithm.phase_terms(phase, minibatch, stats)
        numbers = {key: value for key, value in stats.items() if isinstance(value, (int, float, torch.Tensor))}
        return {**{f"term {key!r}": value for key, value in terms.items()},
                **{f"statistic {key!r}": value for key, value in numbers.items()}}

    def own_state() -> dict:
        """The algorithm object's numbers, flags, strings and tensors, and its policy's buffers, as values."""
        state = {key: value.clone() if isinstance(value, torch.Tensor) else value
                 for key, value in vars(algorithm).items() if isinstance(value, OWN_VALUE_TYPES)}
        return state | {f"policy.{name}": value for name, value in buffer_values(algorithm.policy).items()}

    problems = []
    # what fails on the small rollout is left to the run, which says why
    with global_streams_kept(), contextlib.suppress(Exception):
        # in float64, so that a term's rounding (8 rows against 16) stays far below the smallest term a blind mean
        # moves (a penalty on the actor's head is ~1e-6 at initialisation), on a copy: the object stays as it was
        algorithm = copy.deepcopy(algorithm)
        algorithm.policy.double()
        batch = {key: value.double() if value.is_floating_point() else value
                 for key, value in algorithm.flatten_rollout(rollout).items()}
        missing = [key for key in algorithm.loss_keys if key not in batch]
        if missing:
            return [f"{name}.loss_keys names {', '.join(map(repr, missing))}, which its flatten_rollout does not give "
                    f"(it gives {', '.join(map(repr, batch))}): add the key to the batch flatten_rollout returns"]
        rows = len(batch["obs"]) // 2
        # the minibatch, and the same with rows of the same kind after it, masked out: a term that respects the mask
        # cannot see them, one that does not moves by as much as they differ from the minibatch's own
        ones = torch.ones(rows, dtype=torch.float64)
        plain = {**{key: batch[key][:rows] for key in algorithm.loss_keys}, MASK: ones}
        padded = {**{key: batch[key][:2 * rows] for key in algorithm.loss_keys}, MASK: pad_rows(ones, 2 * rows)}
        for phase in algorithm.update_phases():
            before, state = global_stream_states(), own_state()
            alone = measured(phase, plain)
            after = global_stream_states()
            shaped = [f"{key} has shape {tuple(value.shape)}" for key, value in alone.items()
                      if key.startswith("term") and torch.as_tensor(value).dim() != 0]
            written = [key for key, value in own_state().items()
                       if key not in state or not same_value(value, state[key])]
            if shaped:
                problems.append(f"{name}.{phase.loss}: {', '.join(shaped)}: each term is one number, summed into the "
                                f"loss (a mean over the minibatch's rows: masked_mean(x, minibatch.get(\"mask\")))")
            elif written:
                problems.append(f"{name}.{phase.loss} writes {', '.join('self.' + key for key in written)}: a "
                                f"population's compiled loss is traced once, so what the loss writes into the "
                                f"algorithm is not repeated at each step; keep such state out of the loss "
                                f"(after_epochs, end_update) and give the loss a per-seed number through loss_inputs, or declare "
                                f"population_update = \"per_seed\" in the class")
            elif not same_states(before, after):
                problems.append(f"{name}.{phase.loss} draws random numbers (from torch's, numpy's or Python's global "
                                f"stream): a population's compiled loss draws none; draw them outside the loss, or "
                                f"declare population_update = \"per_seed\" in the class (its own update, seed by "
                                f"seed, in each seed's own streams)")
            else:
                with_padding = measured(phase, padded)
                changed = [key for key, value in alone.items() if not torch.allclose(
                    torch.as_tensor(value, dtype=torch.float64),
                    torch.as_tensor(with_padding[key], dtype=torch.float64), rtol=1e-7, atol=1e-12, equal_nan=True)]
                if changed:
                    problems.append(f"{name}.{phase.loss}: {', '.join(changed)} change(s) when its minibatch is padded "
                                    f"with masked rows, as a population pads every seed's minibatches to one shape: "
                                    f"take every mean over rows with masked_mean(x, minibatch.get(\"mask\")) "
                                    f"(algorithms/core.py)")
                else:
                    refused = what_vmap_refuses(algorithm, phase, plain)
                    if refused:
                        problems.append(f"{name}.{phase.loss} cannot run over a seed axis, as a population runs it "
                                        f"({refused}): over that axis a value is one per seed, so the loss may not "
                                        f"read one in Python (.item(), .tolist(), an `if` on a tensor or on a loss "
                                        f"input) nor give a tensor a shape its values decide (boolean-mask indexing, "
                                        f"nonzero); write it with tensor ops (torch.where, torch.clamp, masked_mean), "
                                        f"or declare population_update = \"per_seed\" in the class")
    return problems


def what_vmap_refuses(algorithm, phase, minibatch: dict) -> str | None:
    """The first sentence of vmap's refusal where the phase's step, run as the population runs it (eager:
    torch.func.vmap over a seed axis of two, of each seed's parameters, buffers, loss inputs, minibatch and
    learning rate, the gradient and the optimizer's step), is refused; None where it runs, or fails otherwise
    (left to the run, which says why)."""
    try:
        step = PopulationStep(algorithm, phase, mode="eager")
        flat = step.layout.flatten(algorithm.policy)
        moments = ({"step": torch.zeros((), dtype=flat.dtype), "exp_avg": torch.zeros_like(flat),
                    "exp_avg_sq": torch.zeros_like(flat)} if step.steps_adam else {})
        seed_inputs = (flat, moments, minibatch, torch.tensor(1e-3, dtype=flat.dtype), torch.tensor(True),
                       loss_input_tensors(algorithm), buffer_values(algorithm.policy))
        two_seeds = pytree.tree_map(lambda value: torch.stack([value, value]), seed_inputs)
        torch.func.vmap(step.one_seed)(*two_seeds)
    except Exception as error:
        text = str(error)
        if text.startswith("vmap:") or "data pointer" in text:  # .tolist() and .numpy() reach for the data
            return text.split(". ")[0]
    return None


def forward_problems(algorithm, obs_dim: int) -> list[str]:
    """What in the policy's forward (the act program's, given its draws) a population would not repeat: a forward
    that draws random numbers of its own (from a global stream: the program draws none, and each seed's act noise
    comes from its own generator), or that writes into the policy (a buffer, as BatchNorm's running statistics; an
    attribute, as a call counter: the program writes nothing of the policy). Found by a forward on a copy of the
    policy; the global streams are left as they were."""
    policy = copy.deepcopy(algorithm.policy)
    state, drew = module_values(policy) | buffer_values(policy), False
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(4, obs_dim, generator=generator)
    with torch.no_grad(), global_streams_kept(), contextlib.suppress(Exception):  # a failure is the run's to say
        before = global_stream_states()
        draws = torch.rand(policy.actor(obs).shape, generator=generator) + 0.5  # as normal or Exp(1) draws alike
        policy(obs, draws)
        drew = not same_states(before, global_stream_states())
    name = type(algorithm).__name__
    if drew:
        return [f"{name}'s policy draws random numbers in its forward (from torch's, numpy's or Python's global "
                f"stream): a population's act program draws none, it gives the forward each seed's draws from the "
                f"seed's own generator; train with algo.backend=torch (each seed's own code)"]
    after = module_values(policy) | buffer_values(policy)
    written = [key for key, value in after.items() if key not in state or not same_value(value, state[key])]
    if written:
        return [f"{name}'s policy writes {', '.join(written)} in its forward: a population acts for every seed in "
                f"one program, which writes nothing of the policy; keep such state in a buffer (register_buffer) "
                f"updated outside the forward (in begin_update, say), or train with algo.backend=torch (each seed's "
                f"own code)"]
    return []


def global_stream_states() -> tuple:
    """Torch's, numpy's and Python's global stream states, as values `same_value` compares."""
    import random

    numpy_name, numpy_keys, *numpy_position = np.random.get_state()
    return torch.get_rng_state(), torch.from_numpy(numpy_keys.copy()), tuple(numpy_position), random.getstate()


def same_states(before: tuple, after: tuple) -> bool:
    return all(same_value(x, y) for x, y in zip(before, after))


# What of an algorithm object's own state loss_problems and refuse_stale_reads compare: numbers, flags, strings and
# tensors.
OWN_VALUE_TYPES = (bool, int, float, str, type(None), torch.Tensor)
MISSING = object()  # an attribute an object does not have


class LossReadError(ValueError):
    """A population's program would train on a value of the algorithm object other than the seed's own."""


def same_value(a, b) -> bool:
    """Equal values (NaN equal to NaN), tensors of one shape and dtype included."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and bool(((a == b) | (a.isnan() & b.isnan())).all())
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return False
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a is b or a == b


def described(value) -> str:
    if value is MISSING:
        return "no such attribute"
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor of shape {tuple(value.shape)}"
    return repr(value)


@contextlib.contextmanager
def global_streams_kept():
    """Torch's, numpy's and Python's global random streams as they were, whatever the block draws."""
    import random

    saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def attributes_the_loss_reads(algorithm, phase, batch: dict) -> list[str]:
    """The names of the algorithm object's own numbers, flags, strings and tensors (its attributes, not values
    inside them) that the phase's loss terms read: recorded while the terms run once, without gradients, on `batch`
    and on a copy of the object (as the program's, a shallow one) whose class records each attribute read, its
    loss_inputs bound as tensors as the program binds them. A loss that fails here is left to the program, which
    says why: nothing is recorded."""
    clone = copy.copy(algorithm)
    watched = {name for name, value in vars(clone).items() if isinstance(value, OWN_VALUE_TYPES)}
    read: set[str] = set()

    class Recording(type(clone)):
        def __getattribute__(self, name):
            if name in watched:
                read.add(name)
            return super().__getattribute__(name)

    rows = len(batch["obs"])
    minibatch = {**{key: batch[key] for key in clone.loss_keys}, MASK: torch.ones(rows)}
    inputs = loss_input_tensors(clone)
    clone.__class__ = Recording
    try:
        with torch.no_grad(), global_streams_kept(), clone.bound_loss_inputs(inputs):
            clone.phase_terms(phase, minibatch, {})
    except Exception:
        return []
    return sorted(read)


def steps_optimizer(optimizer: torch.optim.Optimizer) -> bool:
    """Whether the population step computes this optimizer's update: torch.optim.Adam without weight decay or
    amsgrad, or torch.optim.SGD without momentum or weight decay (one parameter group, not maximizing)."""
    return what_the_step_does_not_compute(optimizer) is None


def optimizer_settings(optimizer: torch.optim.Optimizer) -> str:
    """What a population step makes of an optimizer, in words: "Adam with betas (0.9, 0.999) and eps 1e-05",
    "plain SGD", or the optimizer's class with what the step does not compute ("SGD with momentum=0.9")."""
    unstepped = what_the_step_does_not_compute(optimizer)
    if unstepped is not None:
        return f"{type(optimizer).__name__}{unstepped}"
    if type(optimizer) is not torch.optim.Adam:
        return "plain SGD"
    group = optimizer.param_groups[0]  # numbers as floats: an eps of 0 and one of 0.0 are the same setting
    return f"Adam with betas {tuple(float(beta) for beta in group['betas'])} and eps {float(group['eps'])}"


def what_the_step_does_not_compute(optimizer: torch.optim.Optimizer) -> str | None:
    """None where the population step computes this optimizer's update (steps_optimizer), else what it does not, as
    words that follow the optimizer's class name ("" for another class than Adam and SGD, " with 2 parameter
    groups", " with weight_decay=0.01")."""
    if type(optimizer) not in (torch.optim.Adam, torch.optim.SGD):
        return ""
    if len(optimizer.param_groups) != 1:
        return f" with {len(optimizer.param_groups)} parameter groups"
    group = optimizer.param_groups[0]
    for key, off in (("weight_decay", 0), ("momentum", 0), ("nesterov", False), ("amsgrad", False),
                     ("maximize", False)):
        if group.get(key, off) != off:
            return f" with {key}={group[key]}"
    return None


def refuse_what_it_cannot_run(algorithms: list) -> None:
    problems = population_problems(algorithms[0])
    if problems:
        raise ValueError(problems[0])


def pad_rows(values: torch.Tensor, rows: int) -> torch.Tensor:
    """values with rows of zeros after them, `rows` in all (values itself where it has them: the callers copy it)."""
    if values.shape[0] == rows:
        return values
    padding = torch.zeros((rows - values.shape[0],) + tuple(values.shape[1:]), dtype=values.dtype)
    return torch.cat([values, padding])


def minibatch_rows(counts: list[int], splits: list[int], width: int, randoms: list, shuffled: bool = True):
    """Each seed's epoch: its own permutation of its valid rows (torch.randperm from its generator, as
    PPO.run_epochs draws it; its rows in order when not shuffled), cut as torch.tensor_split cuts it into the seed's own number of minibatches (the
    first n mod M one row longer), each minibatch padded to `width` rows. Returns row indices and the mask, both
    [most minibatches, seeds, width] (minibatch m is a contiguous [seeds, width] slab: one shape and stride
    whatever the count); a seed with fewer minibatches has empty ones at the end."""
    most = max(splits)
    rows = torch.zeros(most, len(counts), width, dtype=torch.long)
    mask = torch.zeros(most, len(counts), width)
    for index, (count, split, seed_randoms) in enumerate(zip(counts, splits, randoms)):
        if split == 0:  # a seed that takes no step this epoch draws nothing
            continue
        permutation = torch.randperm(count, generator=seed_randoms.torch) if shuffled else torch.arange(count)
        # tensor_split's pieces as two blocks (a slice per piece costs more than the epoch's indexing): the first
        # count % split pieces of size + 1 rows, then the others of `size` rows, each laid in order
        size, longer = divmod(count, split)
        cut = longer * (size + 1)
        if longer:
            rows[:longer, index, :size + 1] = permutation[:cut].view(longer, size + 1)
            mask[:longer, index, :size + 1] = 1.0
        rows[longer:split, index, :size] = permutation[cut:].view(split - longer, size)
        mask[longer:split, index, :size] = 1.0
    return rows, mask


def step_means(per_step: list[dict], stepped: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each seed's mean of every statistic over the steps it took (stepped: [seeds, steps]); ratio_max its max."""
    means = {}
    for key in per_step[0]:
        values = torch.stack([step[key] for step in per_step], dim=1)
        if key == "ratio_max":
            means[key] = torch.where(stepped, values, -math.inf).amax(dim=1)
        else:  # where, not a product: a step a seed did not take may hold NaN (an empty minibatch's mean)
            means[key] = torch.where(stepped, values, 0.0).sum(dim=1) / stepped.sum(dim=1).clamp(min=1)
    return means


def gather_minibatches(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """values [seeds, rows, ...] at rows [minibatches, seeds, width] -> [minibatches, seeds, width, ...]: one
    indexing call for an epoch, each minibatch a contiguous slab."""
    seed = torch.arange(values.shape[0])[:, None]
    return values[seed, rows]
