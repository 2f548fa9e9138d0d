"""Bring your own torch model: parameter vectors, FedAvg / FedOpt, DP-FedAvg with adaptive clipping.

Needs the ``torch`` package (``pip install 'securefed[torch]'``; the ``dp-torch`` and ``rl`` extras
bring it too); importing ``securefed`` itself never imports this module.

* :func:`module_to_vector` / :func:`vector_to_module` (and :func:`arrays_to_vector` /
  :func:`vector_to_arrays` for a list of numpy arrays): a model's parameters as one float64
  vector, so that a round submits a model delta directly
  (``rnd.submit(client, module_to_vector(local) - global_vector, weight=w)``).
* :class:`Client`: one client's own data (``examples`` sliced into minibatches, ``context``
  given whole, e.g. a user's rating history) and its own values of the private parameters.
* Client-private parameters (``FedAvgConfig(private_parameters=("user.weight",))``): a per-user
  embedding (FedMF's, NCF's ``p_u``) stays on the device. Each client keeps its own copy
  (:attr:`FedAvg.private_state`, saved in :meth:`FedAvg.state_dict` and so in checkpoints),
  trains it with the shared ones, and uploads only the shared parameters' delta: the transport,
  any DP clip and the ledger's charge see the shared part alone. :meth:`FedAvg.client_model`
  is the model a client predicts with.
* :class:`FedAvg`, a :class:`~securefed.runtime.FederatedAlgorithm`: every sampled client copies
  the global model (and its own private parameters), runs ``local_epochs`` of minibatch SGD on
  its own examples and submits its shared parameters' delta; the server moves the model with
  the mean delta through a server optimiser
  (:mod:`securefed.server_optim`: ``sgd`` with ``lr=1`` is McMahan et al. 2017's FedAvg;
  ``momentum``, ``adam``, ``yogi`` are Reddi et al. 2021's FedOpt). The weight rules each
  transport needs are applied here, from what the transport declares (its capabilities and
  public parameters), never by asking which transport it is:

  - without DP, client ``k`` weighs ``n_k / max_j n_j`` (``weighting="examples"``; at most 1, so
    ``w * delta`` stays inside secure aggregation's value range whenever ``delta`` does) or 1
    (``"uniform"``), and the mean is ``total / weight``;
  - under DP (a transport whose ``capabilities.dp_placement`` is set) the weights are
    ``min(n_k / weight_cap, 1)`` (``dp_weight_cap``; ``None``: 1 for everyone), so that one
    client moves the sum by at most the transport's clip, and the mean divides by the *fixed*
    denominator ``q * sum_k w_k`` (``q`` the sampling rate, sum over all clients), never by the
    released weight: McMahan et al. 2018, "Learning Differentially Private Recurrent Language
    Models", DP-FedAvg with the fixed-denominator estimator. ``q`` is the run's: stated once,
    in ``RunOptions.sampling`` (``run_rounds`` tells the transport's ledger, FedAvg reads it
    there); the round is refused if the transport charges another rate.

* Adaptive clipping (:class:`AdaptiveClipping`; Andrew et al. 2021, "Differentially Private
  Learning with Adaptive Clipping", Algorithm 1): the clip ``C_t`` follows a target quantile
  ``gamma`` of the update norms by the geometric rule
  ``C_{t+1} = C_t * exp(-eta_C * (b_t - gamma))``, ``b_t`` the noisy fraction of clients whose
  update norm was at most ``C_t``. The fraction is released by the *same* Gaussian mechanism as
  the update: each client submits ``[delta_k * A / C_t (clipped to norm A), B * (2 b_k - 1)]``,
  a vector of norm at most ``sqrt(A^2 + B^2) = C`` (the transport's clip), and the transport adds
  ``N(0, (sigma C)^2)`` to every coordinate and charges its ledger once per round for
  ``sigma``. The update then carries the multiplier ``z_delta = sigma C / A`` and the bit count
  the std ``sigma_b = sigma C / (2 B)``, i.e. ``z_delta = (sigma^-2 - (2 sigma_b)^-2)^(-1/2)``:
  their Theorem 1's split, and the quantile's noise is charged to the same ledger as the
  update's. (Given ``sigma_b``, ``B = sigma C / (2 sigma_b)``; it must stay below ``C``.)

Determinism: each client's minibatch order comes from ``seeds.generator("fedavg", round,
client)``; the model must itself be deterministic (no dropout drawing from torch's global
generator).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

try:
    import torch
    from torch import nn
except ModuleNotFoundError as missing:  # name the extra rather than a bare traceback
    if missing.name != "torch":
        raise
    raise ModuleNotFoundError(  # an ImportError; .name lets callers map it to the extra
        "securefed.torch needs PyTorch, which is not installed: pip install 'securefed[torch]' "
        "(torch==2.13.0, CPU)",
        name="torch",
    ) from None

from securefed.errors import AggregationError, InsecureParameterError
from securefed.randomness import SeedTree
from securefed.runtime import ClientSampling
from securefed.server_optim import ServerOptimiser, ServerOptimiserConfig
from securefed.transport.base import Transport
from securefed.transport.capabilities import TransportNeeds

WEIGHTINGS = ("examples", "uniform")
Batch = Sequence[torch.Tensor]
LossFunction = Callable[[nn.Module, Batch], torch.Tensor]


# ------------------------------------------------------------------------------ vectors
def _parameters(
    module: nn.Module, names: Collection[str] | None = None
) -> list[tuple[str, nn.Parameter]]:
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if names is not None:
        named = [(name, p) for name, p in named if name in names]
    if not named:
        raise ValueError(f"{type(module).__name__} has no trainable parameter to flatten")
    return named


def parameter_shapes(
    module: nn.Module, names: Collection[str] | None = None
) -> dict[str, tuple[int, ...]]:
    """Name and shape of each trainable parameter (only those in ``names`` if given), in
    :func:`module_to_vector`'s order."""
    return {name: tuple(p.shape) for name, p in _parameters(module, names)}


def module_to_vector(module: nn.Module, names: Collection[str] | None = None) -> np.ndarray:
    """The trainable parameters of ``module`` (only those in ``names`` if given) as one float64
    vector (``named_parameters`` order)."""
    return np.concatenate(
        [p.detach().cpu().double().reshape(-1).numpy() for _, p in _parameters(module, names)]
    )


def vector_to_module(
    vector: np.ndarray, module: nn.Module, names: Collection[str] | None = None
) -> None:
    """Write ``vector`` (from :func:`module_to_vector` of a module of the same architecture,
    with the same ``names``) into ``module``'s trainable parameters, in place, in their own dtype.

    Raises:
        ValueError: a vector of another length, not 1-D, or not finite.
    """
    vector = np.asarray(vector, dtype=np.float64)
    named = _parameters(module, names)
    expected = sum(p.numel() for _, p in named)
    if vector.ndim != 1 or vector.size != expected:
        raise ValueError(
            f"vector of shape {vector.shape} does not fit {type(module).__name__}: it has "
            f"{expected} trainable numbers"
        )
    if not np.isfinite(vector).all():
        raise ValueError("the parameter vector holds a non-finite value")
    offset = 0
    with torch.no_grad():
        for _, p in named:
            part = vector[offset : offset + p.numel()].reshape(p.shape)
            p.copy_(torch.from_numpy(part).to(dtype=p.dtype, device=p.device))
            offset += p.numel()


def arrays_to_vector(arrays: Sequence[np.ndarray]) -> np.ndarray:
    """A list of numpy arrays (e.g. a Keras or JAX model's weights) as one float64 vector."""
    if not len(arrays):
        raise ValueError("no array to flatten")
    return np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in arrays])


def vector_to_arrays(vector: np.ndarray, like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Split ``vector`` into float64 arrays of the shapes of ``like`` (inverse of
    :func:`arrays_to_vector`).

    Raises:
        ValueError: a vector of another length than the arrays of ``like`` hold together.
    """
    vector = np.asarray(vector, dtype=np.float64)
    shapes = [np.shape(a) for a in like]
    sizes = [math.prod(s) for s in shapes]
    if vector.ndim != 1 or vector.size != sum(sizes):
        raise ValueError(f"vector of shape {vector.shape} does not fit {sum(sizes)} numbers")
    bounds = np.cumsum([0, *sizes])
    pieces = zip(bounds[:-1], bounds[1:], shapes, strict=True)
    return [vector[a:b].reshape(s).copy() for a, b, s in pieces]


# ------------------------------------------------------------------------------ pure rules
def example_weights(
    n_examples: np.ndarray, weighting: str, *, dp: bool, weight_cap: float | None = None
) -> np.ndarray:
    """Per-client aggregation weights, all in ``[0, 1]``.

    Args:
        n_examples: each client's number of examples.
        weighting: ``"examples"`` (``n_k / max_j n_j``) or ``"uniform"`` (1); not used under DP.
        dp: the transport adds DP noise: ``min(n_k / weight_cap, 1)`` (McMahan et al. 2018),
            all 1 without a cap.
        weight_cap: the cap ``w_hat`` under DP (``None``: uniform).
    """
    counts = np.asarray(n_examples, dtype=np.float64)
    if dp:
        if weight_cap is None:
            return np.ones_like(counts)
        return np.minimum(counts / weight_cap, 1.0)
    if weighting == "uniform":
        return np.ones_like(counts)
    return counts / counts.max()


def weighted_mean(deltas: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``sum_k w_k delta_k / sum_k w_k`` (FedAvg's aggregate; McMahan et al. 2017, Alg. 1)."""
    weights = np.asarray(weights, dtype=np.float64)
    if weights.sum() <= 0:
        raise ValueError("the weights sum to zero: the mean is undefined")
    return np.tensordot(weights, np.asarray(deltas, dtype=np.float64), axes=1) / weights.sum()


def clip_to_norm(vector: np.ndarray, bound: float) -> tuple[np.ndarray, float]:
    """``vector * min(1, bound / ||vector||)`` and the norm before clipping."""
    norm = float(np.linalg.norm(vector))
    return (vector * (bound / norm) if norm > bound else vector), norm


def quantile_split(noise_multiplier: float, count_noise: float, clip: float) -> tuple[float, float]:
    """How a vector of norm at most ``clip`` is shared between the update and the clipped bit.

    Returns ``(A, B)``: the update part's norm bound and the bit's magnitude, with
    ``A^2 + B^2 = clip^2`` and ``B = noise_multiplier * clip / (2 * count_noise)``, so that the
    count of clipped clients carries noise std ``count_noise`` (Andrew et al. 2021, Theorem 1).

    Raises:
        InsecureParameterError: ``count_noise <= noise_multiplier / 2`` (``B >= clip``: the
            update would get no share).
    """
    share = noise_multiplier * clip / (2.0 * count_noise)
    if share >= clip:
        raise InsecureParameterError(
            f"adaptive clipping's count noise {count_noise:g} must exceed half the noise "
            f"multiplier ({noise_multiplier / 2:g}): Andrew et al.'s split "
            "z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2) is undefined otherwise"
        )
    return math.sqrt(clip * clip - share * share), share


def update_noise_multiplier(noise_multiplier: float, count_noise: float) -> float:
    """``z_delta = (z^-2 - (2 sigma_b)^-2)^(-1/2)``: the update's own multiplier when the bit
    count shares the Gaussian mechanism of multiplier ``z`` (Andrew et al. 2021, Theorem 1)."""
    rest = noise_multiplier**-2 - (2.0 * count_noise) ** -2
    if rest <= 0:
        raise InsecureParameterError("count_noise must exceed half the noise multiplier")
    return rest**-0.5


def geometric_clip_update(
    clip: float, unclipped_fraction: float, target_quantile: float, clip_lr: float
) -> float:
    """``C * exp(-eta_C * (b - gamma))`` (Andrew et al. 2021, the geometric update)."""
    return clip * math.exp(-clip_lr * (unclipped_fraction - target_quantile))


# ------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class AdaptiveClipping:
    """Adaptive clipping of DP-FedAvg (Andrew et al. 2021).

    Attributes:
        initial_clip: ``C_0`` (> 0).
        target_quantile: ``gamma``, the share of clients left unclipped, in (0, 1).
        clip_lr: ``eta_C`` of the geometric update (> 0; the paper uses 0.2).
        count_noise: ``sigma_b``, the noise std on the count of unclipped clients (``None``: the
            paper's ``expected clients / 20``).
    """

    initial_clip: float = 0.1
    target_quantile: float = 0.5
    clip_lr: float = 0.2
    count_noise: float | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_clip) and self.initial_clip > 0):
            raise ValueError(f"initial_clip must be finite and > 0, got {self.initial_clip!r}")
        if not 0 < self.target_quantile < 1:
            raise ValueError(f"target_quantile must lie in (0, 1), got {self.target_quantile!r}")
        if not (math.isfinite(self.clip_lr) and self.clip_lr > 0):
            raise ValueError(f"clip_lr must be finite and > 0, got {self.clip_lr!r}")
        if self.count_noise is not None and not (
            math.isfinite(self.count_noise) and self.count_noise > 0
        ):
            raise ValueError(f"count_noise must be finite and > 0, got {self.count_noise!r}")


@dataclass(frozen=True)
class FedAvgConfig:
    """What :class:`FedAvg` does each round.

    Attributes:
        local_epochs: passes over its examples each sampled client makes (>= 1).
        batch_size: minibatch size of the local SGD (>= 1).
        client_lr: the clients' SGD step (> 0).
        weighting: ``"examples"`` or ``"uniform"`` without DP (module docstring).
        server: the server optimiser (:mod:`securefed.server_optim`).
        sampling: ``None`` (the default): the run's own, as ``RunOptions.sampling`` states it
            (read from the transport's ledger, which :func:`~securefed.runtime.run_rounds` tells
            it), so that the sampling is stated once; a ``ClientSampling`` given here must be the
            run's (a round is refused otherwise).
        dp_weight_cap: under DP, ``w_k = min(n_k / dp_weight_cap, 1)`` (``None``: all 1).
        adaptive_clipping: adaptive clipping under DP (``None``: the transport's fixed clip).
        private_parameters: names (``named_parameters``) of the client-private parameters, e.g. a
            per-user embedding: each client keeps its own copy on the device, trains it locally,
            and never uploads it; the transport (and any DP clip and charge) sees only the rest.
        shared_parameters: names of the uploaded, averaged parameters (``None``: every trainable
            parameter not private). Given, every trainable parameter must be in exactly one of
            the two sets.
    """

    local_epochs: int = 1
    batch_size: int = 32
    client_lr: float = 0.1
    weighting: str = "examples"
    server: ServerOptimiserConfig = field(default_factory=ServerOptimiserConfig)
    sampling: ClientSampling | None = None
    dp_weight_cap: float | None = None
    adaptive_clipping: AdaptiveClipping | None = None
    private_parameters: tuple[str, ...] = ()
    shared_parameters: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("local_epochs", "batch_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (math.isfinite(self.client_lr) and self.client_lr > 0):
            raise ValueError(f"client_lr must be finite and > 0, got {self.client_lr!r}")
        if self.weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if not isinstance(self.server, ServerOptimiserConfig):
            raise ValueError("server must be a ServerOptimiserConfig")
        if self.sampling is not None and not isinstance(self.sampling, ClientSampling):
            raise ValueError("sampling must be None (the run's) or a runtime.ClientSampling")
        for name in ("private_parameters", "shared_parameters"):
            names = getattr(self, name)
            if names is None and name == "shared_parameters":
                continue
            if isinstance(names, str) or not all(isinstance(n, str) for n in names):
                raise ValueError(f"{name} must be a tuple of parameter names, got {names!r}")
            object.__setattr__(self, name, tuple(names))
        both = sorted(set(self.private_parameters) & set(self.shared_parameters or ()))
        if both:
            raise ValueError(
                f"parameter(s) {both} are marked private and also listed in shared_parameters: "
                "a private parameter stays on the client's device and is never uploaded, so it "
                "cannot also be averaged; list each parameter in one of the two"
            )
        if self.dp_weight_cap is not None and not (
            math.isfinite(self.dp_weight_cap) and self.dp_weight_cap > 0
        ):
            raise ValueError(f"dp_weight_cap must be finite and > 0, got {self.dp_weight_cap!r}")
        if self.adaptive_clipping is not None and self.dp_weight_cap is not None:
            raise ValueError(
                "adaptive_clipping needs uniform DP weights (the clipped bit's sensitivity "
                "assumes weight 1): leave dp_weight_cap None"
            )


# ------------------------------------------------------------------------------ clients
@dataclass(frozen=True, eq=False)
class Client:
    """One client: its own data, and its own values of the model's private parameters.

    Attributes:
        examples: tensors with the client's examples along the first axis (e.g.
            ``(items, ratings)``), sliced into minibatches.
        context: tensors the client holds once, not per example (e.g. its rating history for a
            user tower); every minibatch gets them whole, after the examples' slices.
        private: initial values of this client's private parameters, by name (a parameter not
            given starts from the model's own value). They live on the client: :class:`FedAvg`
            trains them locally and never uploads them.
    """

    examples: tuple[torch.Tensor, ...]
    context: tuple[torch.Tensor, ...] = ()
    private: Mapping[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        examples, context = tuple(self.examples), tuple(self.context)
        for kind, tensors in (("examples", examples), ("context", context)):
            if not all(isinstance(t, torch.Tensor) for t in tensors):
                raise ValueError(f"a client's {kind} must be torch tensors")
        sizes = {len(t) for t in examples}
        if not examples or len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                "a client's examples must be non-empty tensors with one length along the first "
                f"axis (got lengths {sorted(sizes)})"
            )
        private = dict(self.private)
        if not all(isinstance(v, torch.Tensor) for v in private.values()):
            raise ValueError("a client's private values must be torch tensors")
        object.__setattr__(self, "examples", examples)
        object.__setattr__(self, "context", context)
        object.__setattr__(self, "private", private)

    @property
    def n_examples(self) -> int:
        return len(self.examples[0])

    def batch(self, index: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The minibatch ``index`` of the examples, followed by the whole context."""
        return tuple(t[index] for t in self.examples) + self.context


def _as_client(k: int, data: Client | Batch) -> Client:
    if isinstance(data, Client):
        return data
    try:
        return Client(tuple(data))
    except ValueError as error:
        raise ValueError(f"client {k}: {error}") from None


def split_parameters(
    module: nn.Module, private: Sequence[str], shared: Sequence[str] | None
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(shared, private)`` names of ``module``'s trainable parameters, in its order.

    Raises:
        ValueError: an unknown name; with ``shared`` given, a trainable parameter in neither set;
            no shared parameter left.
    """
    trainable = [name for name, p in module.named_parameters() if p.requires_grad]
    unknown = sorted((set(private) | set(shared or ())) - set(trainable))
    if unknown:
        raise ValueError(
            f"{type(module).__name__} has no trainable parameter {unknown}; it has {trainable}"
        )
    if shared is not None:
        neither = [n for n in trainable if n not in private and n not in shared]
        if neither:
            raise ValueError(
                f"trainable parameter(s) {neither} are neither shared nor private: list each "
                "in shared_parameters or private_parameters (or freeze it)"
            )
    shared_names = tuple(n for n in trainable if n not in private)
    if not shared_names:
        raise ValueError("every trainable parameter is private: there is nothing to federate")
    return shared_names, tuple(n for n in trainable if n in private)


# ------------------------------------------------------------------------------ the algorithm
class FedAvg:
    """FedAvg / FedOpt / DP-FedAvg over any ``nn.Module`` (module docstring).

    Args:
        model: the global model (its shared parameters are overwritten after every round; its
            private ones keep their initial values: the server never learns the clients').
        clients: one :class:`Client` per client (or, as before, one tuple of example tensors);
            client ``k`` is ``clients[k]``.
        loss: ``loss(model, batch)`` -> scalar loss of a minibatch (:meth:`Client.batch`: the
            client's example tensors sliced along the first axis, then its context tensors).
        config: :class:`FedAvgConfig`.
        round_hook: extra clients in every round (the audit's canaries): an object with
            ``extra_clients(round_id) -> ids`` (beyond ``len(clients)``; they join the round's
            clients) and ``submit(rnd, round_id)`` (called after the real clients' updates,
            before ``rnd.result()``), e.g. :class:`securefed.audit.whitebox.CanaryHook` for a
            white-box audit of the final model (:func:`securefed.audit.whitebox.
            estimate_from_model_delta`). Their updates enter the aggregate like any client's.

    Attributes:
        n_clients: ``len(clients)``.
        shared_names, private_names: the uploaded and the client-private parameters.
        shapes: name and shape of each shared parameter, in :attr:`params`'s order.
        params: the global (shared) parameters as one float64 vector.
        clip_history: the clip of each round run under adaptive clipping.
    """

    def __init__(
        self,
        model: nn.Module,
        clients: Sequence[Client | Batch],
        loss: LossFunction,
        config: FedAvgConfig | None = None,
        *,
        round_hook: object | None = None,
    ) -> None:
        self.config = FedAvgConfig() if config is None else config
        if round_hook is not None and not (
            callable(getattr(round_hook, "extra_clients", None))
            and callable(getattr(round_hook, "submit", None))
        ):
            raise ValueError("round_hook needs extra_clients(round_id) and submit(rnd, round_id)")
        self.round_hook = round_hook
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch nn.Module, got {type(model).__name__}")
        if not callable(loss):
            raise ValueError("loss must be callable: loss(model, batch) -> scalar tensor")
        self.model = model
        self.loss = loss
        self.clients = [_as_client(k, data) for k, data in enumerate(clients)]
        if not self.clients:
            raise ValueError("FedAvg needs at least one client")
        self.shared_names, self.private_names = split_parameters(
            model, self.config.private_parameters, self.config.shared_parameters
        )
        self.n_examples = np.array([c.n_examples for c in self.clients], dtype=np.int64)
        self.n_clients = len(self.clients)
        self.shapes = parameter_shapes(model, self.shared_names)
        self.params = module_to_vector(model, self.shared_names)
        self.private_state = [self._initial_private(k) for k in range(self.n_clients)]
        self._local = copy.deepcopy(model)
        self.optimiser = ServerOptimiser(self.config.server)
        clipping = self.config.adaptive_clipping
        self.clip = None if clipping is None else clipping.initial_clip
        self.clip_history: list[float] = []
        self._rate: float | None = None

    def _initial_private(self, k: int) -> dict[str, torch.Tensor]:
        own = self.clients[k].private
        stray = sorted(set(own) - set(self.private_names))
        if stray:
            raise ValueError(
                f"client {k} gives private values for {stray}, which are not private parameters"
                f" (private_parameters: {list(self.private_names)})"
            )
        named = dict(self.model.named_parameters())
        state = {}
        for name in self.private_names:
            reference = named[name]
            value = own.get(name, reference.detach())
            if tuple(value.shape) != tuple(reference.shape):
                raise ValueError(
                    f"client {k}'s private {name} has shape {tuple(value.shape)}, the model's "
                    f"{tuple(reference.shape)}"
                )
            state[name] = value.detach().to(dtype=reference.dtype).clone()
        return state

    def _load_client(self, module: nn.Module, client: int) -> None:
        """The global shared parameters and client ``client``'s private ones, into ``module``."""
        vector_to_module(self.params, module, self.shared_names)
        named = dict(module.named_parameters())
        with torch.no_grad():
            for name, value in self.private_state[client].items():
                named[name].copy_(value)

    def client_model(self, client: int) -> nn.Module:
        """The model as client ``client`` holds it (global shared parameters, its own private
        ones): what the client predicts with, on its device. A fresh copy."""
        module = copy.deepcopy(self._local)
        self._load_client(module, client)
        return module

    @property
    def transport_needs(self) -> TransportNeeds:
        return TransportNeeds("FedAvg")

    # -- the client --------------------------------------------------------------------
    def local_delta(self, client: int, rng: np.random.Generator) -> np.ndarray:
        """Client ``client``'s update: its locally trained shared parameters minus the global
        ones. Its private parameters are trained too and stay with it (never returned)."""
        local = self._local
        self._load_client(local, client)
        local.train()
        optimiser = torch.optim.SGD(local.parameters(), lr=self.config.client_lr)
        data = self.clients[client]
        size = data.n_examples
        for _ in range(self.config.local_epochs):
            order = torch.from_numpy(rng.permutation(size))
            for start in range(0, size, self.config.batch_size):
                index = order[start : start + self.config.batch_size]
                optimiser.zero_grad(set_to_none=True)
                value = self.loss(local, data.batch(index))
                value.backward()
                optimiser.step()
        named = dict(local.named_parameters())
        self.private_state[client] = {
            name: named[name].detach().clone() for name in self.private_names
        }
        return module_to_vector(local, self.shared_names) - self.params

    # -- a round -----------------------------------------------------------------------
    def run_round(
        self, round_id: int, clients: np.ndarray, transport: Transport, seeds: SeedTree
    ) -> Mapping[str, float]:
        """Train the sampled clients, aggregate their deltas over ``transport``, step the server.

        Raises:
            InsecureParameterError: DP with a sampling rate other than the transport charges,
                or adaptive clipping over a transport without DP.
            AggregationError: a DP round that sampled no client.
        """
        dp = transport.capabilities.dp_placement is not None
        if self.config.adaptive_clipping is not None and not dp:
            raise InsecureParameterError(
                "adaptive_clipping applies to DP-FedAvg only: the transport adds no DP noise, "
                "and a clip without noise bounds nothing (use a dp transport or drop it)"
            )
        clients = np.asarray(clients, dtype=np.int64)
        if dp:
            self._rate = self._check_sampling(transport)
            if len(clients) == 0:
                raise AggregationError(
                    f"round {round_id} sampled no client: a DP round releases its noisy sum "
                    "whoever took part, and cannot be opened empty"
                )
        elif len(clients) == 0:
            return {"loss_clients": float("nan")}
        weights = example_weights(
            self.n_examples[clients],
            self.config.weighting,
            dp=dp,
            weight_cap=self.config.dp_weight_cap,
        )
        adaptive = self.config.adaptive_clipping is not None
        width = self.params.size + (1 if adaptive else 0)
        extra = np.zeros(0, dtype=np.int64)
        if self.round_hook is not None:
            extra = np.asarray(self.round_hook.extra_clients(round_id), dtype=np.int64)
            if np.any(extra < self.n_clients):
                raise ValueError("the round hook's clients must come after the model's own")
        rnd = transport.open_round(
            round_id, np.concatenate([clients, extra]), shape=(1, width), seeds=seeds
        )
        rnd.broadcast("model", self.params)
        parts = self._adaptive_parts(transport) if adaptive else None
        norms = []
        for client, weight in zip(clients.tolist(), weights.tolist(), strict=True):
            delta = self.local_delta(client, seeds.generator("fedavg", round_id, client))
            norms.append(float(np.linalg.norm(delta)))
            if parts is not None:
                delta = self._with_clipped_bit(delta, *parts)
            rnd.submit(client, delta, weight=weight)
        if self.round_hook is not None:
            self.round_hook.submit(rnd, round_id)
        aggregate = rnd.result()
        metrics = {"update_norm_median": float(np.median(norms))}
        if parts is not None:
            mean, unclipped = self._adaptive_mean(aggregate.total[0], *parts)
            metrics |= {"clip": self.clip, "unclipped_fraction": unclipped}
            self.clip_history.append(self.clip)
            cfg = self.config.adaptive_clipping
            self.clip = geometric_clip_update(
                self.clip, unclipped, cfg.target_quantile, cfg.clip_lr
            )
        elif dp:
            mean = aggregate.total[0] / self._fixed_denominator()
        else:
            mean = aggregate.total[0] / aggregate.weight
        self._apply(mean)
        return metrics

    def _check_sampling(self, transport: Transport) -> float:
        """The run's sampling rate, after checking the transport charges it."""
        charged = transport.view.public.get("sample_rate")
        ledger = transport.ledger  # the accountant, told the run's sampling by run_rounds
        run_mode = None if ledger is None else ledger.sampling
        run_rate = None if ledger is None else ledger.sampling_rate
        given = self.config.sampling
        if given is not None:
            rate = given.rate(self.n_clients)
            if run_mode is not None and run_mode != given.mode:
                raise InsecureParameterError(
                    f"FedAvgConfig.sampling is {given.mode!r} but the run samples {run_mode!r}: "
                    "leave FedAvgConfig.sampling None (the run's) or give the same ClientSampling"
                )
        elif run_rate is not None:
            rate = float(run_rate)
        elif charged is not None:  # run_round called outside run_rounds: the charged rate
            rate = float(charged)
        else:
            raise InsecureParameterError(
                "FedAvg under DP needs the run's sampling rate for its fixed denominator: run it"
                " with run_rounds (which tells the transport's ledger) or give "
                "FedAvgConfig.sampling"
            )
        if charged is None or not math.isclose(float(charged), rate, rel_tol=1e-9):
            raise InsecureParameterError(
                f"FedAvg's fixed denominator assumes sampling rate {rate:g} (the run's sampling"
                f" {given or run_mode}), the transport charges {charged!r}: build the transport "
                "with sample_rate=RunOptions.sampling.rate(n_clients)"
            )
        return rate

    def _fixed_denominator(self) -> float:
        """``q * sum_k w_k`` over every client: the expected weight of a round (public)."""
        all_weights = example_weights(
            self.n_examples, self.config.weighting, dp=True, weight_cap=self.config.dp_weight_cap
        )
        return self._rate * float(all_weights.sum())

    def _count_noise(self) -> float:
        given = self.config.adaptive_clipping.count_noise
        return given if given is not None else self._fixed_denominator() / 20.0

    def _adaptive_parts(self, transport: Transport) -> tuple[float, float]:
        public = transport.view.public
        clip, sigma = float(public["dp_clip"]), float(public["dp_noise_multiplier"])
        return quantile_split(sigma, self._count_noise(), clip)

    def _with_clipped_bit(self, delta: np.ndarray, update_bound: float, bit: float) -> np.ndarray:
        clipped, norm = clip_to_norm(delta, self.clip)
        unclipped = 1.0 if norm <= self.clip else 0.0
        # Scaled a hair inside the bound so that the transport's own clip leaves it untouched.
        scaled = clipped * (update_bound * (1 - 1e-12) / self.clip)
        return np.append(scaled, bit * (2.0 * unclipped - 1.0))

    def _adaptive_mean(
        self, total: np.ndarray, update_bound: float, bit: float
    ) -> tuple[np.ndarray, float]:
        expected = self._fixed_denominator()
        mean = total[:-1] * (self.clip / (update_bound * (1 - 1e-12))) / expected
        unclipped = float(total[-1] / (2.0 * bit) / expected + 0.5)
        return mean, unclipped

    def _apply(self, mean: np.ndarray) -> None:
        updated = []
        offset = 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            block = self.params[offset : offset + size].reshape(shape)
            step = mean[offset : offset + size].reshape(shape)
            updated.append(self.optimiser.step(name, block, step).reshape(-1))
            offset += size
        self.params = np.concatenate(updated)
        vector_to_module(self.params, self.model, self.shared_names)

    # -- checkpoints -------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """The global parameters, the server optimiser's moments, the clip (if adaptive) and
        each client's private parameters (``client/<k>/<name>``; on a real deployment each
        client keeps its own on its device)."""
        state = {"params": self.params.copy()}
        state |= {f"server/{k}": v for k, v in self.optimiser.state_dict().items()}
        if self.clip is not None:
            state["clip"] = np.array(self.clip)
            state["clip_history"] = np.array(self.clip_history, dtype=np.float64)
        for k, private in enumerate(self.private_state):
            state |= {f"client/{k}/{n}": v.cpu().numpy().copy() for n, v in private.items()}
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore :meth:`state_dict`.

        Raises:
            KeyError: a missing entry. ValueError: parameters of another size.
        """
        params = np.asarray(state["params"], dtype=np.float64)
        if params.shape != self.params.shape:
            raise ValueError(f"params of shape {params.shape}, the model has {self.params.shape}")
        private_state = []
        for k, current in enumerate(self.private_state):
            restored = {}
            for name, value in current.items():
                array = np.asarray(state[f"client/{k}/{name}"])
                if array.shape != tuple(value.shape):
                    raise ValueError(
                        f"client {k}'s private {name} of shape {array.shape}, the model has "
                        f"{tuple(value.shape)}"
                    )
                restored[name] = torch.from_numpy(array.copy()).to(dtype=value.dtype)
            private_state.append(restored)
        server = {k[len("server/") :]: v for k, v in state.items() if k.startswith("server/")}
        self.optimiser.load_state_dict(server)
        if self.clip is not None:
            self.clip = float(state["clip"])
            self.clip_history = [float(c) for c in np.asarray(state["clip_history"])]
        self.params = params.copy()
        self.private_state = private_state
        vector_to_module(self.params, self.model, self.shared_names)
