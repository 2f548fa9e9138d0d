"""FedSlate: federated SlateQ across platforms that share a user (paper sections 3-4).

Each platform ``p`` holds a local Q-network ``Q_p(s_p)`` over its ``N`` candidates; a server
network fuses the platforms' Q-value vectors into ``Qf_p = S([Q_p, Q_others])`` (own platform
first) for each platform, and the platforms build their slates from ``Qf_p`` (SlateQ's
decomposition ``Q(s, A) = sum_{i in A} P(i | s, A) Qf(s, i)``). Only Q-values cross the
platform boundary (paper assumption A4). specs/fedslate.md sections 1-2 hold the facts this
module follows; where it deviates from the paper's code, the docstrings and docs/fedslate.md say
so.

Acting (paper Algorithm 3, "acting phase"). Once per round the server asks every platform for
``Q_p`` on its current (frozen) observation, returns ``Qf_p`` to each, and the platforms take
turns stepping the shared user with their greedy (epsilon-greedy) slates.

Learning (paper Algorithms 1-2; every ``learn_every`` rounds after ``burn_in``). One replay
batch of round indices, the same for every platform (rounds aligned):

1. Targets, for each platform with rewards: ``Y_p = r_p + gamma X_p(s'_p) (1 - done)`` where
   ``X_p = sum_{j in A*} P(j | s'_p, A*) Qf'_p(s'_p, j)`` on the target networks and ``A*`` is the
   greedy slate on ``Qf'_p`` (Q-learning) or the slate taken next (SARSA).
2. Algorithm 1, for each platform with rewards (A): ``Huber(Qf_p(s_p, clicked), Y_p)``; steps
   ``Q_p`` and the server; the other platforms' networks are frozen (their Q-values are inputs).
3. Algorithm 2, for each platform without rewards (B): recompute the other platforms' Q-values
   with their updated networks, take B's greedy slate on ``Qf_B`` and regress its slate value
   ``V_B = sum_{j in A_B} P(j | s_B, A_B) Qf_B(s_B, j)`` onto the team target (A's ``Y_A``; the
   mean of the ``Y_p`` with several platforms with rewards); steps ``Q_B`` and the server. B
   never sees its own rewards (its replay holds NaN for them).

So a learning step updates each local network once and the server network once per platform
(twice with two platforms), as the paper's protocol mandates; :attr:`RunResult.updates` counts
them.

Variants (``FedSlateConfig.variant``):

* ``"fedslate"``: the above.
* ``"extended"``: the paper's Algorithm 4 for sparse team rewards: every platform receives its
  own (possibly sparse) feedback and learns from it with Algorithm 1's update.
* ``"fedq"``: this project's reading of the paper's FedQ baseline ("lacks cross-platform
  consideration"): the same protocol, but the server sees only the platform's own Q-values (the
  other platforms' inputs are zeros), so nothing crosses platforms but the team target.
* ``"linear"``: the paper's ablation: the server is a network with one hidden layer and no
  activation (a linear map).

Alignment (``FedSlateConfig.alignment``). The server fuses ``[Q_p[i], Q_others[i]]`` position by
position. With ``"position"`` (the paper) the other platforms send their Q-values of *their own*
candidates: with separate corpora position ``i`` is a different document on each platform, so
the fusion carries the user's state across platforms but nothing about ``p``'s documents, and a
platform without rewards has no item-level signal (docs/fedslate.md section 5). With ``"item"``
(this project's variant) platform ``q`` evaluates its network on ``p``'s candidates (its own user
features, ``p``'s document features) for ``p``'s fused values, so ``Qf_p[i]`` combines every
platform's value of the same document. The price: each platform's candidate features (its
catalogue, no user data) reach the others.

The server network runs behind a ``securefed.fusion`` channel (``FedSlateConfig.fusion``, built
by :func:`securefed.fusion.build_fusion_channel`; the plaintext one wraps :class:`ServerNetwork`
and its optimiser): the parties exchange only the messages a split deployment would: Q-value
vectors up, fused values down, gradients of the loss with respect to the fused values up,
gradients with respect to the Q-values down. The channel's view
(:class:`~securefed.views.FusionView`, ``RunResult.fusion_view``) records them, each exchange
tagged with its protocol step: :data:`ACT` (the acting inquiry), :data:`TARGET` (the target
networks' values of the next states), :data:`SELECT` (B's greedy slate) and :data:`LEARN` (an
update's forward and backward). A channel that cannot serve the configuration refuses before
the first episode.

Under a DP transport (``"dp"``, ``"ckks+dp"``) each platform also trains its local network by
DP-SGD (:class:`LocalDPSGD`: per-row gradients summed by unit, clipped, noised) charged to the
same ledger as its fusion rows, and picks the positions its loss needs locally, so that every
row it sends is a charged release or post-processing (docs/fedslate.md section 9, issue 34).

The run (:func:`run_fedslate`) is a loop over episodes and rounds; its state is a
:class:`FedSlateRun` and its steps are functions of it: :func:`acting_inquiry`,
:func:`choose_slates` and :func:`play_round` (acting), :func:`learn` (:func:`td_targets`, the
losses :func:`clicked_loss` and :func:`slate_value_loss`, :func:`exchange_update` through the
channel), :func:`sync_targets` and :func:`report_progress` (evaluation).

Deviations from the paper's code (spec section 2), each a parameter: the local networks default
to the per-item form of :class:`~securefed.rl.slateq.LocalQNetwork` (``local_arch="flat"`` is the
paper's)
and the server to a per-position network over the concatenated Q-values (``server_arch="flat"``
is the paper's); SiLU instead of Mish; rewards scaled by 0.01 with a linear output (no Tanh); Adam
lr 1e-3 instead of 0.01; the agents' choice model is the environment's (``choice_model=
"paper_code"`` is the code's); no raw document ids in the state; separate corpora per platform.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn

from securefed import NO_PAYLOADS, RoundSelection, SeedTree
from securefed.fusion import (
    DP_CHANNELS,
    FUSION_CHANNELS,
    RELU_FIT,
    DPFusionOptions,
    FusionNeeds,
    ModuleFusionChannel,
    build_fusion_channel,
)
from securefed.fusion import dp as fusion_dp
from securefed.fusion.expansion import PolynomialNetwork
from securefed.privacy import accounting, epsilon_of_history, noise_for_target
from securefed.privacy.ledger import epsilon_with_discrete
from securefed.privacy.noise import NoiseSource, as_noise_source
from securefed.ranking import top_n
from securefed.rl.checkpoint import EpisodeCheckpoints, FusionViewState, TrainingState
from securefed.rl.choices import ALIGNMENTS, PLATFORM_NAMES, SERVER_ARCHS, VARIANTS
from securefed.rl.envs.choc_kale import ChocKaleBatch, EnvStreams
from securefed.rl.slateq import (
    ACTIVATIONS,
    ChoiceModel,
    EnsembleMLP,
    ReplayBuffer,
    RunResult,
    SlateQConfig,
    checkpoint_if_due,
    choice_weights,
    explore,
    features,
    local_network,
    make_choice_model,
    masked_huber,
    next_values,
    resume_counters,
    select_slates,
    torch_generator,
)

__all__ = [
    "ACT",
    "ALIGNMENTS",
    "DP_ACTINGS",
    "DP_DIAGNOSTICS",
    "DP_LEARNINGS",
    "LEARN",
    "LOCAL_TRAININGS",
    "PLATFORM_NAMES",
    "SELECT",
    "SERVER_ARCHS",
    "TARGET",
    "VARIANTS",
    "FedSlateConfig",
    "FedSlateRun",
    "LocalDPSGD",
    "ServerNetwork",
    "acting_inquiry",
    "choose_slates",
    "clicked_loss",
    "dp_noise_multipliers",
    "dp_unit_releases",
    "etror",
    "exchange_update",
    "greedy_positions",
    "learn",
    "learn_sums",
    "moving_average",
    "on_candidates_of",
    "optimal_reward",
    "own_acting_values",
    "play_round",
    "report_progress",
    "run_fedslate",
    "run_reference",
    "server_network",
    "slate_value_loss",
    "start_run",
    "summarize",
    "sync_targets",
    "td_targets",
    "unit_sums",
]

LOCAL_TRAININGS = ("dp-sgd", "none")
DP_ACTINGS = ("released", "own")
DP_LEARNINGS = ("rows", "sums")
"""Under joint DP, what a learning step releases (:attr:`FedSlateConfig.dp_learning`)."""
DP_SAMPLINGS = ("poisson",)
"""How a platform samples the units of its DP-SGD sums (:attr:`FedSlateConfig.dp_sampling`)."""
DP_DIAGNOSTICS = ("noiseless-rows", "noiseless-local")
"""Diagnostics that switch one Gaussian mechanism's noise off (not private settings: the run's
``epsilon_spent`` is ``None``; :attr:`FedSlateConfig.dp_diagnostic`)."""
"""Under a DP transport, what a platform acts on (:attr:`FedSlateConfig.dp_acting`)."""
"""How the platforms train their local networks under a DP transport
(:attr:`FedSlateConfig.dp_local_training`)."""
DP_TAIL_FRACTION = 0.1
"""Under DP, the share of ``dp_delta`` given to the tail of the replay-draw bound
(:func:`dp_unit_releases`); the Gaussian mechanism keeps the rest."""
ACT, TARGET, SELECT, LEARN = "act", "target", "select", "learn"
"""Tags of the fusion exchanges in the view: the acting inquiry, the target networks' values,
B's greedy-slate evaluation, an update's forward and backward."""


@dataclass(frozen=True)
class FedSlateConfig(SlateQConfig):
    """Hyper-parameters of one FedSlate run (the shared ones:
    :class:`~securefed.rl.slateq.SlateQConfig`).

    Args:
        variant: one of :data:`VARIANTS` (module docstring).
        server_arch: ``"position"`` (default): one MLP applied at every candidate position to
            the concatenated Q-values ``[Q_p[i], Q_others[i]]`` (own platform first), weights
            shared over positions, so its size does not grow with ``N``; ``"flat"``: the
            paper's MLP on the whole concatenation ``[Q_p, Q_others]`` (``K N`` inputs, ``N``
            outputs).
        server_hidden: hidden widths of the server network (the linear ablation keeps the
            first width and drops the activation).
        server_lr: the server's Adam learning rate (default: ``lr``).
        alignment: ``"position"`` (the paper: every platform's Q-values of its own candidates)
            or ``"item"`` (the others' networks evaluated on the fused platform's candidates;
            module docstring).
        fusion: the transport of the Q-values, the fusion channel the server network runs
            behind: one of :data:`securefed.fusion.FUSION_CHANNELS` (a channel that cannot
            serve this configuration refuses when the run is built, naming why). ``"ckks"``
            needs a polynomial server activation (``activation`` or ``server_activation``
            ``"polynomial"``) and ``server_arch="position"``.
        dp_epsilon: for the ``"dp"`` and ``"ckks+dp"`` transports (required there, refused
            elsewhere): the budget of each platform's unit of privacy, one user's episode on
            that platform (:func:`dp_unit_releases`; docs/fedslate.md section 9).
        dp_delta: the budget's delta (it includes the tail probability of the release bound,
            :data:`DP_TAIL_FRACTION` of it).
        dp_clip: L2 bound on each Q-value row a platform sends (one state's ``N`` values).
        dp_grad_clip: L2 bound on each loss-gradient row a platform sends; ``None``:
            ``huber_delta / batch_size`` (a full batch's Huber gradient never exceeds it).
        dp_local_training: under a DP transport, how each platform trains its local network:
            ``None`` or ``"dp-sgd"`` (default): DP-SGD with each unit's gradient clipped to
            ``dp_local_clip``, charged to the platform's ledger with its fusion rows
            (:class:`LocalDPSGD`; docs/fedslate.md section 9), so every later row is
            post-processing; ``"none"``: the pre-issue-34 training on raw data, kept only to
            measure what the local DP costs: the run's ``epsilon_spent`` is then ``None`` (not
            established: one unit moves every later row) and the record says why. Refused
            under the other transports.
        dp_local_clip: L2 bound on one unit's gradient of the local network per learning step
            (the gradient of the batch's summed loss restricted to that unit's rows).
        dp_local_noise: the local DP-SGD's noise multiplier; ``None``: the same as the fusion
            rows', both calibrated together to the budget (:func:`dp_noise_multipliers`).
        dp_acting: under the ``"dp"`` transport, what a platform acts on for its own user:
            ``"released"`` (default): the fused values of every platform's noised acting rows,
            charged (61 rows per unit); ``"own"`` (joint DP, the billboard model): the server
            network's current weights (a post-processing of the charged learning releases),
            evaluated *by the platform* on its own clean Q-values with the others' inputs at 0,
            so no acting row leaves any platform and none is charged; the slate goes to the
            user it is computed for, and every output for any other user is post-processing of
            the releases and that user's own data (docs/fedslate.md section 9). Refused under
            the other transports and with ``dp_local_training="none"``.
        dp_learning: under joint DP (``dp_acting="own"``), what a learning step releases:
            ``"rows"`` (default): every platform's Q-value and gradient rows of the drawn
            rounds, each clipped and noised, through the fusion channel (``2K + 1`` rows per
            drawn round of a unit); ``"sums"``: no row at all. Each platform trains the
            server network as it acts with it, on its own clean Q-values with the others'
            inputs at 0 (its TD targets on its own target networks the same way), takes each
            unit's gradient of the batch loss in *both* networks' weights (its local network's
            and the server network's), clips it as a whole to ``dp_local_clip``, sums and
            noises once (:class:`LocalDPSGD`): one Gaussian release per platform and learning
            step, of which the server gets the server network's part and steps on it, the
            platform keeps the rest. A unit's releases fall from its rows plus its DP-SGD
            steps to its DP-SGD steps alone (:func:`dp_unit_releases`); the fusion channel
            then carries nothing (it charges no row and refuses every exchange). The team
            target ``Y_A`` still reaches platform B (section 9, "Not covered").
        dp_sampling: under ``dp_learning="sums"`` only: ``None`` (default): every unit of the
            batch enters the platform's DP-SGD sum; ``"poisson"``: in every learning step the
            platform keeps each unit of its batch independently with probability
            ``dp_sample_rate``, drawn from its own secret generator and never revealed (the
            release's shape and count do not depend on it, its scale is the fixed
            ``q * batch_size``), and its ledger charges each of the unit's steps as a
            Poisson-subsampled Gaussian under replacement adjacency
            (:func:`securefed.privacy.accounting.replace_sampled_rdp`), so the same epsilon
            needs a smaller sigma (privacy amplification by sampling; docs/fedslate.md section
            9). Refused under ``dp_learning="rows"``, where the fusion rows of the drawn rounds
            tell the server which units the step used, and with a diagnostic.
        dp_sample_rate: ``q`` in (0, 1) for ``dp_sampling="poisson"`` (required there, refused
            elsewhere).
        dp_server_clip: under ``dp_learning="sums"`` only: ``None`` (default): each unit's
            concatenated gradient (local and server weights) is clipped to ``dp_local_clip`` as
            a whole; a value ``C_s`` in ``(0, dp_local_clip)``: its server part is clipped to
            ``C_s`` and its local part to ``sqrt(dp_local_clip^2 - C_s^2)`` (per-part
            clipping, McMahan et al. 2018), so the whole still has norm at most
            ``dp_local_clip`` and the release, its noise and the ledger are unchanged; only how
            the clip's budget is shared between the two networks moves (the server part holds
            most of a unit's gradient norm, the local part most of the coordinates).
        dp_diagnostic: a measurement of what each mechanism costs, **not a private setting**:
            ``"noiseless-rows"`` releases the fusion rows clipped but without noise,
            ``"noiseless-local"`` the local DP-SGD sums clipped but without noise (everything
            else, the ledgers' noise multipliers included, as without it). The run's
            ``epsilon_spent`` is then ``None`` per platform and its record says why. Needs the
            ``"dp"`` transport with local DP-SGD.
        server_activation: the server network's hidden activation (``None``: ``activation``,
            which the local networks use), e.g. ``"polynomial"`` with SiLU local networks.
        ckks_scale_bits: for the encrypted transports (refused elsewhere): ``log2`` of the CKKS
            scale; ``None``: :data:`CKKS_SCALE_BITS` (2^55). The scale sets the key-dependent
            error of every released batch sum, and with it the flooding that hides it: at 2^55
            (ring 16384, one spare prime) the server network trains on nearly exact gradients
            and the run follows plaintext; 40 (ring 8192) makes a step about 2.8x cheaper but
            floods the sums with std 73, which swamps the server's gradients
            (docs/fedslate.md section 7).
    """

    variant: str = "fedslate"
    server_arch: str = "position"
    server_hidden: tuple[int, ...] = (16, 16)
    server_lr: float | None = None
    alignment: str = "position"
    fusion: str = "plaintext"
    server_activation: str | None = None
    dp_epsilon: float | None = None
    dp_delta: float = 1e-5
    dp_clip: float = 1.0
    dp_grad_clip: float | None = None
    dp_local_training: str | None = None
    dp_local_clip: float = 1.0
    dp_local_noise: float | None = None
    dp_acting: str = "released"
    dp_diagnostic: str | None = None
    dp_learning: str = "rows"
    dp_sampling: str | None = None
    dp_sample_rate: float | None = None
    dp_server_clip: float | None = None
    ckks_scale_bits: int | None = None

    def __post_init__(self) -> None:
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {self.variant!r}")
        if self.variant == "extended":
            # Algorithm 4: every platform has (possibly sparse) access to its own rewards.
            object.__setattr__(self, "feedback", (True,) * self.num_platforms)
        super().__post_init__()
        if self.server_arch not in SERVER_ARCHS:
            raise ValueError(f"server_arch must be one of {SERVER_ARCHS}")
        if self.alignment not in ALIGNMENTS:
            raise ValueError(f"alignment must be one of {ALIGNMENTS}, got {self.alignment!r}")
        hidden = tuple(int(w) for w in self.server_hidden)
        if not hidden or any(w < 1 for w in hidden):
            raise ValueError(f"server_hidden needs >= 1 positive width, got {self.server_hidden}")
        object.__setattr__(self, "server_hidden", hidden)
        if self.server_lr is not None and not self.server_lr > 0:
            raise ValueError(f"server_lr must be > 0, got {self.server_lr}")
        if self.num_platforms > len(PLATFORM_NAMES):
            raise ValueError(f"at most {len(PLATFORM_NAMES)} platforms")
        if not any(self.feedback):
            raise ValueError("FedSlate needs at least one platform with feedback (the team target)")
        if self.fusion not in FUSION_CHANNELS:
            raise ValueError(f"fusion must be one of {FUSION_CHANNELS}, got {self.fusion!r}")
        if self.server_activation is not None and self.server_activation not in ACTIVATIONS:
            raise ValueError(
                f"server_activation must be one of {ACTIVATIONS}, got {self.server_activation!r}"
            )

        if (self.fusion in DP_CHANNELS) != (self.dp_epsilon is not None):
            raise ValueError(
                f"dp_epsilon is required by the DP transports {sorted(DP_CHANNELS)} and applies "
                f"to no other: transport {self.fusion!r} with dp_epsilon {self.dp_epsilon!r}"
            )
        if self.dp_epsilon is None and (
            self.dp_local_training is not None
            or self.dp_local_noise is not None
            or self.dp_local_clip != 1.0
        ):
            raise ValueError(
                "dp_local_training, dp_local_clip and dp_local_noise apply to the DP transports "
                f"{sorted(DP_CHANNELS)} only, not to {self.fusion!r}"
            )
        if self.dp_local_training not in (None, *LOCAL_TRAININGS):
            raise ValueError(
                f"dp_local_training must be one of {LOCAL_TRAININGS}, "
                f"got {self.dp_local_training!r}"
            )
        if not (math.isfinite(self.dp_local_clip) and self.dp_local_clip > 0):
            raise ValueError(f"dp_local_clip must be finite and > 0, got {self.dp_local_clip!r}")
        sigma = self.dp_local_noise
        if sigma is not None and not (math.isfinite(sigma) and sigma > 0):
            raise ValueError(f"dp_local_noise must be finite and > 0, got {sigma!r}")
        if sigma is not None and not self.local_dp:
            raise ValueError("dp_local_noise applies to dp_local_training='dp-sgd' only")
        if self.dp_acting not in DP_ACTINGS:
            raise ValueError(f"dp_acting must be one of {DP_ACTINGS}, got {self.dp_acting!r}")
        if self.dp_acting == "own" and (self.fusion != "dp" or not self.local_dp):
            raise ValueError(
                "dp_acting='own' needs the 'dp' transport with local DP-SGD: the platform "
                "evaluates the server network itself (under ckks+dp its weights are not the "
                "platform's to evaluate), and without DP-SGD its own network carries earlier "
                f"users' raw data into every slate; got fusion {self.fusion!r}, "
                f"dp_local_training {self.dp_local_training!r}"
            )
        if self.dp_diagnostic is not None and (
            self.dp_diagnostic not in DP_DIAGNOSTICS or self.fusion != "dp" or not self.local_dp
        ):
            raise ValueError(
                f"dp_diagnostic must be one of {DP_DIAGNOSTICS} under the 'dp' transport with "
                f"local DP-SGD; got {self.dp_diagnostic!r}, fusion {self.fusion!r}, "
                f"dp_local_training {self.dp_local_training!r}"
            )
        if self.dp_learning not in DP_LEARNINGS:
            raise ValueError(f"dp_learning must be one of {DP_LEARNINGS}, got {self.dp_learning!r}")
        if self.dp_learning == "sums" and (
            self.dp_acting != "own"
            or self.dp_local_noise is not None
            or self.dp_diagnostic == "noiseless-rows"
        ):
            raise ValueError(
                "dp_learning='sums' needs joint DP (dp_acting='own': the server network is "
                "trained as the platforms act with it, on their own values) and releases only "
                "DP-SGD sums (no dp_local_noise to split with fusion rows, no rows to leave "
                f"noiseless); got dp_acting {self.dp_acting!r}, dp_local_noise "
                f"{self.dp_local_noise!r}, dp_diagnostic {self.dp_diagnostic!r}"
            )
        if self.dp_sampling is not None and self.dp_sampling not in DP_SAMPLINGS:
            raise ValueError(f"dp_sampling must be one of {DP_SAMPLINGS}, got {self.dp_sampling!r}")
        if self.dp_sampling is not None and (
            self.dp_learning != "sums" or self.dp_diagnostic is not None
        ):
            raise ValueError(
                "dp_sampling needs dp_learning='sums' without a diagnostic: amplification by "
                "sampling holds only while the sample stays secret, and under 'rows' the "
                "fusion rows of the drawn rounds show the server which units a step used "
                f"(got dp_learning {self.dp_learning!r}, dp_diagnostic {self.dp_diagnostic!r})"
            )
        if (self.dp_sampling is None) != (self.dp_sample_rate is None):
            raise ValueError(
                "dp_sample_rate is required by dp_sampling='poisson' and applies to nothing "
                f"else: dp_sampling {self.dp_sampling!r}, dp_sample_rate {self.dp_sample_rate!r}"
            )
        rate = self.dp_sample_rate
        if rate is not None and (
            isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0 < rate < 1
        ):
            raise ValueError(
                f"dp_sample_rate must lie in (0, 1) (1 is dp_sampling=None), got {rate!r}"
            )
        server_clip = self.dp_server_clip
        if server_clip is not None and (
            self.dp_learning != "sums"
            or isinstance(server_clip, bool)
            or not isinstance(server_clip, (int, float))
            or not (math.isfinite(server_clip) and 0 < server_clip < self.dp_local_clip)
        ):
            raise ValueError(
                "dp_server_clip needs dp_learning='sums' (the only release with a server part) "
                "and a value in (0, dp_local_clip), the local part taking the rest of the clip: "
                f"got dp_server_clip {server_clip!r}, dp_learning {self.dp_learning!r}, "
                f"dp_local_clip {self.dp_local_clip!r}"
            )
        if self.dp_epsilon is not None and self.feedback_prob < 1.0:
            raise ValueError(
                f"the DP transports need feedback_prob 1, got {self.feedback_prob!r}: the losses "
                "average over the rows whose feedback was revealed, so one unit's reveals would "
                "rescale every other row's gradient, which the accounting does not charge"
            )
        if self.dp_epsilon is not None:
            # Checked here so that a bad option fails when the run is configured.
            rows = 0 if self.dp_learning == "sums" else 1
            self.dp_options(releases_per_unit=rows, tail_delta=0.0, local_steps=1)
        if self.ckks_scale_bits is not None:
            if self.fusion not in ENCRYPTED_FUSIONS:
                raise ValueError(
                    f"ckks_scale_bits applies to the encrypted transports {ENCRYPTED_FUSIONS} "
                    f"only, not to {self.fusion!r}"
                )
            bits = self.ckks_scale_bits
            if isinstance(bits, bool) or not isinstance(bits, int) or not 30 <= bits <= 59:
                raise ValueError(
                    f"ckks_scale_bits must be an integer in [30, 59], got {self.ckks_scale_bits!r}"
                )

    @property
    def local_dp(self) -> bool:
        """Whether the platforms train their local networks with DP-SGD (a DP transport
        without ``dp_local_training="none"``)."""
        return self.dp_epsilon is not None and self.dp_local_training != "none"

    def dp_options(
        self,
        *,
        releases_per_unit: int | None = None,
        tail_delta: float | None = None,
        local_steps: int | None = None,
    ) -> DPFusionOptions:
        """The DP channel's options: the budget, clips, the release bound of one unit and the
        fusion rows' noise multiplier (default: :func:`dp_unit_releases` of this
        configuration, the noise from :func:`dp_noise_multipliers`).

        Raises:
            ValueError: without ``dp_epsilon`` (not a DP transport), or a bad option.
        """
        if self.dp_epsilon is None:
            raise ValueError(f"transport {self.fusion!r} has no DP options (dp_epsilon unset)")
        if releases_per_unit is None or tail_delta is None or local_steps is None:
            bound = dp_unit_releases(self)
            releases_per_unit, tail_delta = bound["releases"], bound["tail_delta"]
            local_steps = bound["local_steps"]
        grad_clip = self.dp_grad_clip
        if grad_clip is None:
            grad_clip = self.huber_delta / self.batch_size
        sigmas = dp_noise_multipliers(
            self, releases=int(releases_per_unit), local_steps=int(local_steps), tail=tail_delta
        )
        return DPFusionOptions(
            epsilon=float(self.dp_epsilon),
            delta=float(self.dp_delta),
            clip=float(self.dp_clip),
            grad_clip=float(grad_clip),
            releases_per_unit=int(releases_per_unit),
            tail_delta=float(tail_delta),
            noise_multiplier=sigmas["fusion"],
            tags=()
            if self.dp_learning == "sums"
            else (TARGET, SELECT, LEARN)
            if self.dp_acting == "own"
            else (ACT, TARGET, SELECT, LEARN),
            clamp_sigmas=CKKS_DP_CLAMP_SIGMAS if self.fusion == "ckks+dp" else None,
        )

    @property
    def server_hidden_activation(self) -> str:
        """The server network's hidden activation (the linear ablation: ``"identity"``)."""
        if self.variant == "linear":
            return "identity"
        return self.server_activation or self.activation

    def fusion_needs(self) -> FusionNeeds:
        """What the server network asks of its fusion channel: ``members`` side by side, its
        hidden activation, one evaluation per platform with that platform's Q-values first,
        Adam, and whether it acts position by position (``server_arch="position"``)."""
        return FusionNeeds(
            members=self.members,
            activation=self.server_hidden_activation,
            layout="per_party",
            optimiser="adam",
            elementwise=self.server_arch == "position",
        )


# --------------------------------------------------------------------------------------------
# DP accounting: how many rows of one unit of privacy a platform releases


def dp_unit_releases(config: FedSlateConfig) -> dict[str, object]:
    """The most Q-value and gradient rows of one unit a platform sends, with a tail bound.

    The unit of privacy is one user's episode on one platform: a platform's data about a user
    is what it observes during that user's episode, and every episode draws a fresh user
    (docs/fedslate.md section 9). Its rows leave the platform in

    * the acting inquiries: one row per round of the episode (``steps_per_platform`` rounds;
      with item alignment the platform also sends its values of every other platform's
      candidates, ``K`` rows a round);
    * the learning steps that draw one of the episode's rounds from the replay: per drawn round,
      one row in each target forward (one per platform with rewards), in each update's forward
      (one per platform), in each greedy-slate forward (one per platform without rewards), and
      its own loss gradient (one): ``2 K + 1`` rows.

    The replay draws are independent of the data: a learning step draws ``batch_size`` rows
    with replacement from a buffer of at least ``m = min(buffer_size, burn_in + 1)`` rows (one
    fewer for SARSA), of which at most ``L = steps_per_platform`` are the episode's; the episode
    stays in the buffer for ``buffer_size + L`` rounds, i.e. in at most ``s =
    ceil((buffer_size + L) / learn_every)`` learning steps. So the number of drawn rounds is
    dominated by ``Binomial(s * batch_size, min(1, L / m))``; ``k`` is its ``1 - tail_delta``
    quantile with ``tail_delta = DP_TAIL_FRACTION * dp_delta``, and a run whose draws exceed
    ``k`` for some unit (probability at most ``tail_delta`` per unit) is covered by adding
    ``tail_delta`` to delta.

    Under local DP-SGD (:attr:`FedSlateConfig.local_dp`) the platform's network takes one
    step per learning step; a step moves with the unit only if it draws one of the unit's
    rounds, so at most ``min(s, k)`` steps involve the unit (``local_steps``; 0 without local
    DP-SGD). Under ``dp_learning="sums"`` no row of a drawn round leaves (``2K + 1`` becomes
    0): the learning step's one release per platform is its DP-SGD sum, counted in
    ``local_steps``.

    Returns:
        ``{"releases": acting + k * (2K + 1), "acting": ..., "drawn_rounds_bound": k,
        "rows_per_drawn_round": 2K + 1, "learning_steps": s, "local_steps": ...,
        "draw_probability": ..., "tail_delta": ...}``.
    """
    from scipy.stats import binom

    k_plat, length = config.num_platforms, config.steps_per_platform
    acting = length * (k_plat if config.alignment == "item" else 1)
    if config.dp_acting == "own":
        acting = 0  # joint DP: the acting values never leave the platform
    per_drawn = 0 if config.dp_learning == "sums" else 2 * k_plat + 1  # sums: no row leaves
    smallest = min(config.buffer_size, config.burn_in + 1) - (1 if config.target == "sarsa" else 0)
    probability = min(1.0, length / max(1, smallest))
    steps = math.ceil((config.buffer_size + length) / config.learn_every)
    draws = steps * config.batch_size
    tail = DP_TAIL_FRACTION * config.dp_delta
    drawn = int(binom.isf(tail, draws, probability)) if probability < 1 else draws
    while drawn < draws and binom.sf(drawn, draws, probability) > tail:
        drawn += 1  # isf is a floating-point inverse; make sure the tail really is <= tail
    return {
        "releases": acting + drawn * per_drawn,
        "acting": acting,
        "drawn_rounds_bound": drawn,
        "rows_per_drawn_round": per_drawn,
        "learning_steps": steps,
        "local_steps": min(steps, drawn) if config.local_dp else 0,
        "draw_probability": probability,
        "tail_delta": tail,
    }


def dp_noise_multipliers(
    config: FedSlateConfig, *, releases: int, local_steps: int, tail: float
) -> dict[str, float | None]:
    """The noise multipliers of the fusion rows and of the local DP-SGD, one ledger per platform.

    A unit's ``releases`` fusion rows and ``local_steps`` DP-SGD steps are Gaussian releases
    about it, composed in Rényi DP in the platform's ledger (no amplification claimed, except
    under ``dp_sampling``: :func:`sampled_noise_multiplier` for the sampled sums). With
    ``dp_local_noise`` unset both share the smallest multiplier that keeps all
    ``releases + local_steps`` within ``(dp_epsilon, dp_delta - tail)``; with it set, the
    fusion rows get the smallest multiplier that fits beside the given local one.

    Returns:
        ``{"fusion": sigma_rows, "local": sigma_sgd}`` (``"local"`` is ``None`` without local
        DP-SGD).

    Raises:
        ValueError: no fusion multiplier up to 1e6 fits beside the given local one.
    """
    budget, delta = float(config.dp_epsilon), float(config.dp_delta) - tail
    accountant = "rdp"
    if config.dp_sampling is not None and config.local_dp and local_steps >= 1:
        sigma = sampled_noise_multiplier(budget, delta, float(config.dp_sample_rate), local_steps)
        return {"fusion": sigma, "local": sigma}  # releases 0 (sums): the rows' is unused
    if not config.local_dp or local_steps < 1:
        sigma = noise_for_target(budget, delta, 1.0, releases, accountant)
        return {"fusion": sigma, "local": None}
    if config.dp_local_noise is None:
        sigma = noise_for_target(budget, delta, 1.0, releases + local_steps, accountant)
        return {"fusion": sigma, "local": sigma}  # releases 0 (sums): the rows' is unused
    local = float(config.dp_local_noise)

    def spent(sigma: float) -> float:
        history = [(sigma, 1.0, releases), (local, 1.0, local_steps)]
        return epsilon_of_history(history, delta, accountant)

    high = 1.0
    while spent(high) > budget:
        high *= 2
        if high > 1e6:
            raise ValueError(
                f"dp_local_noise {local:g} over {local_steps} steps leaves no room for the "
                f"fusion rows in epsilon {budget:g}: raise it or the budget"
            )
    low = 0.0
    while high - low > 1e-3 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if spent(mid) <= budget else (mid, high)
    return {"fusion": high, "local": local}


def sampled_epsilon(sigma: float, sample_rate: float, steps: int, delta: float) -> float:
    """Epsilon at ``delta`` of ``steps`` Poisson-subsampled Gaussian releases under
    replacement adjacency (:class:`~securefed.privacy.accounting.SampledReplaceGaussian`, the
    ledger's charge under ``dp_sampling="poisson"``)."""
    release = accounting.SampledReplaceGaussian(float(sigma), float(sample_rate))
    return epsilon_with_discrete([], [(release, int(steps))], delta)


def sampled_noise_multiplier(
    epsilon: float, delta: float, sample_rate: float, steps: int, tolerance: float = 0.01
) -> float:
    """The smallest sigma (to ``tolerance`` in epsilon) whose :func:`sampled_epsilon` over
    ``steps`` stays within ``epsilon``: a doubling search, then a bisection that only moves
    its upper end to a sigma within the budget.

    Raises:
        ValueError: no sigma up to 1e6 fits.
    """
    high = 1.0
    while sampled_epsilon(high, sample_rate, steps, delta) > epsilon:
        high *= 2
        if high > 1e6:
            raise ValueError(
                f"no noise multiplier up to 1e6 keeps {steps} sampled steps at rate "
                f"{sample_rate:g} within epsilon {epsilon:g}"
            )
    low = 0.0
    while epsilon - sampled_epsilon(high, sample_rate, steps, delta) > tolerance:
        mid = (low + high) / 2
        if high - low < 1e-6 * high:
            break
        low, high = (
            (low, mid)
            if sampled_epsilon(mid, sample_rate, steps, delta) <= epsilon
            else (mid, high)
        )
    return high


# --------------------------------------------------------------------------------------------
# Local DP-SGD: each platform's network trained under user-level DP


@dataclass(eq=False)
class LocalDPSGD:
    """DP-SGD of one platform's local Q-network with one unit's gradient clipped as a whole.

    A learning step's parameter gradient is ``sum_b J_b^T g_b`` over the batch's rows (``J_b``
    the network's Jacobian at row ``b``'s state, ``g_b`` the gradient the fusion channel
    returned for it). The rows are grouped by unit (the episode their round belongs to: one
    user), each unit's sum is clipped to ``clip``, and the clipped sums are added up and
    noised (:func:`securefed.fusion.dp.gaussian_sum`; Abadi et al. 2016 with user-level
    clipping, McMahan et al. 2018). The optimiser steps on the noised sum over the batch size:
    the network, and every row it later sends, is post-processing of these releases, of the
    fusion's released rows and of the party's own data of the user being served.

    Attributes:
        party: the platform's name.
        network: its online network (members side by side: member ``s``'s rows only move
            member ``s``'s weights, and each member is its own run with its own units).
        clip: the L2 bound per unit and step.
        noise_multiplier: sigma.
        noise: the platform's noise source for these releases.
        sample_rate: under ``dp_sampling="poisson"`` (``step_joint`` only), each unit's
            probability of entering a step's sum; ``None``: every unit enters.
        sampler: the platform's secret generator of those inclusions (required with
            ``sample_rate``; never shared with the server or another platform).
        server_clip: (``step_joint`` only) the bound on a unit's server part, its local part
            taking ``sqrt(clip^2 - server_clip^2)``; ``None``: the whole clipped to ``clip``.
    """

    party: str
    network: nn.Module
    clip: float
    noise_multiplier: float
    noise: NoiseSource
    sample_rate: float | None = None
    sampler: np.random.Generator | None = None
    server_clip: float | None = None

    def __post_init__(self) -> None:
        if (self.sample_rate is None) != (self.sampler is None):
            raise ValueError("a sampled DP-SGD needs both sample_rate and its secret sampler")
        if self.server_clip is not None and not 0 < self.server_clip < self.clip:
            raise ValueError(
                f"server_clip must lie in (0, clip {self.clip}), got {self.server_clip!r}"
            )

    def split_clipped(self, unit_gradients: np.ndarray, local_size: int) -> np.ndarray:
        """``(S, U, P)`` unit gradients with the first ``local_size`` entries (the local part)
        clipped to ``sqrt(clip^2 - server_clip^2)`` and the rest (the server part) to
        ``server_clip``, so every unit's whole has norm at most ``clip`` (per-part clipping);
        unchanged without ``server_clip``. The release then clips the whole to ``clip`` again,
        which leaves such a unit as it is: its sensitivity is ``2 clip`` either way."""
        if self.server_clip is None:
            return unit_gradients
        local_clip = math.sqrt(self.clip**2 - self.server_clip**2)
        values = torch.from_numpy(unit_gradients)
        out = torch.empty_like(values)
        for part, bound in (
            (slice(None, local_size), local_clip),
            (slice(local_size, None), self.server_clip),
        ):  # clip_rows_last_axis's factor min(1, bound / norm) on each part
            norms = torch.linalg.vector_norm(values[..., part], dim=-1, keepdim=True)
            factors = torch.where(norms > bound, bound / norms, torch.ones_like(norms))
            torch.mul(values[..., part], factors, out=out[..., part])
        return out.numpy()

    def sampled_units(self, unit_gradients: np.ndarray) -> np.ndarray:
        """The unit slots ``(S, U, P)`` with each slot kept independently with probability
        ``sample_rate`` (others zeroed; Poisson sampling, one draw per slot whatever the slot
        holds, so the generator's state never depends on the data); unchanged without it."""
        if self.sample_rate is None:
            return unit_gradients
        keep = self.sampler.random(unit_gradients.shape[:-1]) < self.sample_rate
        return unit_gradients * keep[..., None]

    def row_gradients(
        self, x: torch.Tensor, output_grads: torch.Tensor, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``(S, B, P)`` per-row parameter gradients ``J_b^T g_b`` in ``dtype``
        (:func:`taped_row_gradients`: one batched backward to the layers' outputs, then the
        outer products per row)."""
        tape: list[TapedLayer] = []
        with taped(self.network, tape):
            out = self.network(x)
        loss = (out * output_grads).sum()
        return taped_row_gradients(loss, tape, [self.network], x.shape[1], dtype)

    def release(self, unit_gradients: np.ndarray) -> np.ndarray:
        """``(S, P)`` the noised sum of the clipped unit gradients ``(S, U, P)``."""
        return fusion_dp.gaussian_sum(unit_gradients, self.clip, self.noise_multiplier, self.noise)

    def release_sampled(self, unit_gradients: np.ndarray) -> np.ndarray:
        """``(S, P)`` the released sum under this platform's sampling: :meth:`release` of
        :meth:`sampled_units` (the sum's shape never depends on the sample)."""
        return self.release(self.sampled_units(unit_gradients))

    def step(
        self,
        optimiser: torch.optim.Optimizer,
        x: torch.Tensor,
        output_grads: torch.Tensor,
        units: np.ndarray,
    ) -> None:
        """One DP-SGD step on rows ``x`` ``(S, B, D)`` with their returned gradients
        ``(S, B, N)`` (of the batch's mean loss) and their units ``(S, B)``."""
        batch = x.shape[1]
        rows = self.row_gradients(x, output_grads.detach() * batch, torch.float64)
        noised = self.release(unit_sums(rows, units).numpy()) / batch
        flat = torch.from_numpy(noised)
        offset = 0
        for p in self.network.parameters():
            size = p[0].numel()
            piece = flat[:, offset : offset + size].reshape(p.shape).to(p.dtype)
            p.grad = piece.contiguous()
            offset += size
        optimiser.step()

    def step_joint(
        self,
        run: FedSlateRun,
        p: int,
        row_loss: Callable[..., torch.Tensor],
        x: torch.Tensor,
        extras: Sequence[torch.Tensor],
        units: np.ndarray,
    ) -> None:
        """One step of ``dp_learning="sums"``: the per-row gradients of ``row_loss`` (the
        loss of one row, ``(S, 1, ...)`` tensors, summed over members) in the platform's
        local weights and the server network's, the network evaluated as the platform acts
        with it (own Q-values first, the others' at 0); summed by unit, each unit's
        concatenated gradient clipped to ``clip`` as a whole, summed and noised
        (:meth:`release`: one Gaussian release, sensitivity ``2 clip``), over the batch size.
        The platform steps its network on the local part; the server gets the server part
        and steps its network on it (Abadi et al. 2016, Algorithm 1, user-level clipping).

        ``row_loss`` is called once, with every (member, row) as a leading slice ``(S B, 1,
        ...)``: it must be a sum over its leading axis of terms that each depend on their own
        slice only (the masked Huber losses of :func:`clicked_loss` and
        :func:`slate_value_loss` are); the per-row gradients are then
        :func:`taped_row_gradients` of that sum."""
        server, k_plat = run.channel.module, run.config.num_platforms
        local_named = list(self.network.named_parameters())
        server_named = list(server.named_parameters())
        s, b = x.shape[:2]
        tape: list[TapedLayer] = []
        with taped(self.network, tape), taped(server, tape):
            q = self.network(x)  # (S, B, N)
            fused = server([q] + [torch.zeros_like(q)] * (k_plat - 1))

        def as_rows(t: torch.Tensor) -> torch.Tensor:  # (S, B, ...) -> (S B, 1, ...)
            return t.reshape(s * b, 1, *t.shape[2:])

        # Every (member, row) as its own leading slice: the row losses' sum, whose gradient in
        # a row's activations is that row's alone (the rows never mix).
        loss = row_loss(as_rows(fused), *[as_rows(e) for e in extras])
        rows = taped_row_gradients(loss, tape, [self.network, server], b)
        scale = b * (self.sample_rate or 1.0)  # fixed: the sample's size is never revealed
        local_size = sum(param[0].numel() for _, param in local_named)
        per_unit = self.split_clipped(unit_sums(rows, units).numpy(), local_size)
        noised = torch.from_numpy(self.release_sampled(per_unit) / scale)
        offset = 0
        for _, param in local_named + server_named:
            size = param[0].numel()
            piece = noised[:, offset : offset + size].reshape(param.shape).to(param.dtype)
            param.grad = piece.contiguous()
            offset += size
        run.local_opt[p].step()
        run.channel.optimiser.step()  # the server, on the release's server part
        run.updates[f"local_{run.names[p]}"] += 1
        run.updates["server"] += 1


def unit_sums(rows: torch.Tensor, units: np.ndarray) -> torch.Tensor:
    """``(S, B, P)`` per-row gradients summed by unit within each member: ``(S, B, P)`` with
    one slot per distinct unit of the member's batch (the first ones, in increasing unit order)
    and zeros after. Each row is added into its unit's slot (``index_add``: ``B P`` additions
    per member, in torch on its threads)."""
    members = units.shape[0]
    out = torch.zeros_like(rows)
    for s in range(members):
        _, slot = np.unique(units[s], return_inverse=True)
        out[s].index_add_(0, torch.from_numpy(slot.reshape(-1)), rows[s])
    return out


@dataclass(frozen=True, eq=False)
class TapedLayer:
    """One layer of an :class:`EnsembleMLP` as a forward under :func:`taped` ran it: its
    weight ``W`` and bias ``b``, its input ``x`` ``(S, R, in)`` and its output before the
    activation ``z = b + x W`` ``(S, R, out)``."""

    weight: nn.Parameter
    bias: nn.Parameter
    inputs: torch.Tensor
    output: torch.Tensor


def _taped_forward(mlp: EnsembleMLP, tape: list[TapedLayer], x: torch.Tensor) -> torch.Tensor:
    """:meth:`EnsembleMLP.forward`, each layer's input and pre-activation output on ``tape``."""
    if x.dim() != 3 or x.shape[0] != mlp.members or x.shape[2] != mlp.sizes[0]:
        raise ValueError(
            f"input must have shape ({mlp.members}, batch, {mlp.sizes[0]}), got {tuple(x.shape)}"
        )
    last = len(mlp.weights) - 1
    for i, (w, b) in enumerate(zip(mlp.weights, mlp.biases, strict=True)):
        z = torch.baddbmm(b, x, w)
        tape.append(TapedLayer(w, b, x, z))
        x = mlp.activation(z) if i < last else mlp.output_activation(z)
    return x


@contextmanager
def taped(network: nn.Module, tape: list[TapedLayer]):
    """Within the block every :class:`EnsembleMLP` of ``network`` records its layers on
    ``tape`` as it runs (:func:`_taped_forward`; the network's own forward is unchanged)."""
    mlps = [m for m in network.modules() if isinstance(m, EnsembleMLP)]
    for mlp in mlps:
        mlp.forward = partial(_taped_forward, mlp, tape)  # an instance attribute, deleted below
    try:
        yield tape
    finally:
        for mlp in mlps:
            del mlp.forward


def taped_row_gradients(
    loss: torch.Tensor,
    tape: list[TapedLayer],
    networks: Sequence[nn.Module],
    batch: int,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """``(S, B, P)`` the gradient of each row's loss in ``networks``' weights (their
    ``named_parameters`` order, each member's slice flattened), by per-sample backpropagation.

    ``loss`` is a sum of per-row terms of a forward under :func:`taped`; a layer ``z = b + x
    W`` run on ``R = B m`` rows (row ``b`` of the batch its ``m`` consecutive rows: the
    per-position server network's candidates) has per-row gradients ``sum_m x_bm^T dz_bm``
    in ``W`` and ``sum_m dz_bm`` in ``b``, with ``dz = dloss/dz`` from one batched backward
    (Goodfellow 2015, "Efficient per-example gradient computations"): the values
    ``torch.func``'s ``vmap(grad)`` gives per row, from one pass over the batch. The products
    are taken in the layers' dtype (float32) and written into one ``dtype`` array.

    Raises:
        ValueError: a parameter of ``networks`` that no taped layer holds (a network not made
            of :class:`EnsembleMLP` layers), or a layer whose rows are not ``B m``.
    """
    held = {id(p) for layer in tape for p in (layer.weight, layer.bias)}
    offsets: dict[int, tuple[int, int]] = {}  # id(param) -> (offset, size per member)
    total = 0
    for network in networks:
        for name, param in network.named_parameters():
            if id(param) not in held:
                raise ValueError(
                    f"parameter {name!r} of {type(network).__name__} is in no taped "
                    "EnsembleMLP layer: its per-row gradients are not computed here"
                )
            offsets[id(param)] = (total, param[0].numel())
            total += param[0].numel()
    out = torch.zeros(tape[0].inputs.shape[0], batch, total, dtype=dtype)
    dz = torch.autograd.grad(loss, [layer.output for layer in tape])
    for layer, d in zip(tape, dz, strict=True):
        s, r, fan_in = layer.inputs.shape
        if r % batch:
            raise ValueError(f"a taped layer ran on {r} rows, not a multiple of batch {batch}")
        m, fan_out = r // batch, d.shape[-1]
        x4 = layer.inputs.detach().reshape(s, batch, m, fan_in)
        d4 = d.reshape(s, batch, m, fan_out)
        weight, bias = layer.weight, layer.bias
        if id(weight) in offsets:
            start, size = offsets[id(weight)]
            view = out[..., start : start + size].view(s, batch, fan_in, fan_out)
            if m == 1:  # one outer product per row, written in place
                view.addcmul_(x4[:, :, 0, :, None], d4[:, :, 0, None, :])
            else:
                view.add_(torch.einsum("sbmi,sbmo->sbio", x4, d4))
        if id(bias) in offsets:
            start, size = offsets[id(bias)]
            out[..., start : start + size].add_(d4.sum(dim=2))
    return out


# --------------------------------------------------------------------------------------------
# The server network


class ServerNetwork(nn.Module):
    """The server's fusion network ``Qf_p = S([Q_p, Q_others])``, for ``S`` members.

    Args:
        members: ``S``.
        num_platforms: ``K``.
        num_candidates: ``N``.
        hidden: hidden widths.
        arch: ``"position"`` or ``"flat"`` (:class:`FedSlateConfig`).
        activation: hidden activation (``"identity"``: the linear ablation).
        output_activation: output activation.
        generator: for the initial weights.
    """

    def __init__(
        self,
        members: int,
        num_platforms: int,
        num_candidates: int,
        hidden: Sequence[int],
        *,
        arch: str = "position",
        activation: str = "silu",
        output_activation: str = "identity",
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if arch not in SERVER_ARCHS:
            raise ValueError(f"arch must be one of {SERVER_ARCHS}, got {arch!r}")
        self.arch, self.num_platforms, self.num_candidates = arch, num_platforms, num_candidates
        self.activation_name, self.output_activation_name = activation, output_activation
        if arch == "position":
            sizes = [num_platforms, *hidden, 1]
        else:
            sizes = [num_platforms * num_candidates, *hidden, num_candidates]
        self.mlp = EnsembleMLP(
            members,
            sizes,
            activation=activation,
            output_activation=output_activation,
            generator=generator,
        )

    def forward(
        self, ordered: Sequence[torch.Tensor], positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Fused values for one platform.

        Args:
            ordered: ``K`` tensors ``(S, B, N)``, the platform's own Q-values first.
            positions: ``(S, B, m)`` candidate indices to evaluate, or ``None`` for all.

        Returns:
            ``(S, B, m)`` (or ``(S, B, N)``) fused Q-values.
        """
        if len(ordered) != self.num_platforms:
            raise ValueError(f"expected {self.num_platforms} Q-value tensors, got {len(ordered)}")
        if self.arch == "flat":
            out = self.mlp(torch.cat(list(ordered), dim=-1))
            return out if positions is None else torch.gather(out, 2, positions)
        stacked = torch.stack(list(ordered), dim=-1)  # (S, B, N, K)
        if positions is not None:
            index = positions[..., None].expand(*positions.shape, self.num_platforms)
            stacked = torch.gather(stacked, 2, index)
        s, b, m, k = stacked.shape
        return self.mlp(stacked.reshape(s, b * m, k)).reshape(s, b, m)

    def numpy_forward(self, ordered: Sequence[np.ndarray]) -> np.ndarray:
        """:meth:`forward` over all positions in numpy (acting)."""
        if self.arch == "flat":
            return self.mlp.numpy_forward(np.concatenate(list(ordered), axis=-1))
        stacked = np.stack(list(ordered), axis=-1)
        s, b, n, k = stacked.shape
        return self.mlp.numpy_forward(stacked.reshape(s, b * n, k)).reshape(s, b, n)

    def polynomial_network(self) -> PolynomialNetwork:
        """The per-position network as a polynomial's layers (what a CKKS channel evaluates).

        Raises:
            ValueError: the flat architecture (a polynomial in all ``K N`` inputs), a
                non-polynomial hidden activation, or an output activation other than identity.
        """
        if self.arch != "position":
            raise ValueError(
                "server_arch 'flat' mixes all K N Q-values (a polynomial in K N variables); "
                "only the per-position server ('position') has a polynomial form here"
            )
        coefficients = {"polynomial": RELU_FIT, "identity": (0.0, 1.0)}
        if self.activation_name not in coefficients:
            raise ValueError(
                f"the server's hidden activation {self.activation_name!r} is not a polynomial "
                "(use 'polynomial')"
            )
        if self.output_activation_name != "identity":
            raise ValueError(
                f"the server's output activation {self.output_activation_name!r} is not a "
                "polynomial (use 'identity')"
            )
        return PolynomialNetwork(
            list(zip(self.mlp.weights, self.mlp.biases, strict=True)),
            coefficients[self.activation_name],
        )


# --------------------------------------------------------------------------------------------
# Metrics (spec section 2: the paper does not define them; these are this project's)


def moving_average(rewards: np.ndarray, window: int = 100) -> np.ndarray:
    """Trailing ``window``-episode moving average; entry ``j`` covers episodes ``j..j+window-1``."""
    rewards = np.asarray(rewards, dtype=np.float64)
    if rewards.ndim != 1 or len(rewards) < window:
        raise ValueError(f"need a 1-D series of >= {window} episodes, got shape {rewards.shape}")
    cumsum = np.concatenate([[0.0], np.cumsum(rewards)])
    return (cumsum[window:] - cumsum[:-window]) / window


def optimal_reward(rewards: np.ndarray, window: int = 100) -> float:
    """The paper's "optimal reward": the best ``window``-episode moving average."""
    return float(moving_average(rewards, window).max())


def etror(rewards: np.ndarray, window: int = 100, fraction: float = 0.99) -> int:
    """Episodes to reach optimal reward: the first episode (1-based, the last episode of the
    window) at which the moving average reaches ``fraction`` of :func:`optimal_reward`."""
    ma = moving_average(rewards, window)
    return int(np.argmax(ma >= fraction * ma.max())) + window


def summarize(result: RunResult, window: int = 100, tail: int = 500) -> dict[str, object]:
    """Per platform and member: optimal reward, ETROR, mean of the last ``tail`` episodes."""
    rewards = result.episode_rewards
    episodes, members, platforms = rewards.shape
    out: dict[str, object] = {}
    for p in range(platforms):
        series = [rewards[:, s, p] for s in range(members)]
        out[PLATFORM_NAMES[p]] = {
            "optimal_reward": [optimal_reward(r, window) for r in series],
            "etror": [etror(r, window) for r in series],
            "final_mean": [float(r[-min(tail, episodes) :].mean()) for r in series],
            "mean": [float(r.mean()) for r in series],
        }
    return out


# --------------------------------------------------------------------------------------------
# Reference policies


REFERENCE_POLICIES = ("random", "highest_k", "lowest_k")


def run_reference(
    config: SlateQConfig, policy: str, users: int = 1000, episodes_at_once: int = 1
) -> RunResult:
    """Episode rewards of fixed policies, ``users`` users in one batch.

    ``policy``: ``"random"`` (uniform slates of distinct candidates; the paper's baseline),
    ``"highest_k"`` (the ``n`` highest-kaleness candidates, the myopic reference of spec
    section 1) or ``"lowest_k"``; or one per platform joined by ``+`` (e.g.
    ``"highest_k+lowest_k"``), to measure how one platform's slates move the others' rewards
    through the shared user. ``config.episodes`` episodes; the result has ``users`` members.

    A fixed policy's episodes are independent draws (a fresh user state and fresh candidates,
    nothing learnt), so ``episodes_at_once`` of them can run side by side in one batch of
    ``users * episodes_at_once`` simulated users: the same distribution of episode rewards (not
    the same numbers as one episode at a time), in far fewer Python-level steps.
    """
    if episodes_at_once < 1:
        raise ValueError(f"episodes_at_once must be >= 1, got {episodes_at_once}")
    per_platform = policy.split("+") if "+" in policy else [policy] * config.num_platforms
    if len(per_platform) != config.num_platforms or any(
        q not in REFERENCE_POLICIES for q in per_platform
    ):
        raise ValueError(
            f"policy must be one of {REFERENCE_POLICIES} or one per platform joined by '+', "
            f"got {policy!r}"
        )
    start = time.perf_counter()
    tree = SeedTree(config.seed)
    cfg_env = config.env_config()
    k_plat, n = config.num_platforms, config.slate_size
    at_once = min(episodes_at_once, config.episodes)
    batch = users * at_once
    env = ChocKaleBatch(
        cfg_env,
        batch,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )
    rng = tree.generator("reference", policy)
    chunks = -(-config.episodes // at_once)
    rewards = np.zeros((chunks * at_once, users, k_plat))
    for chunk in range(chunks):
        # Batch row e * users + u is user u's episode chunk * at_once + e.
        episodes = slice(chunk * at_once, (chunk + 1) * at_once)
        env.reset()
        done = False
        while not done:
            p = env.turn
            if per_platform[p] == "random":
                slates = explore(np.zeros((batch, n), np.int64), 1.0, rng, config.num_candidates)
            else:
                docs = env.observation(p).docs
                sign = -1.0 if per_platform[p] == "highest_k" else 1.0
                slates = top_n(-sign * docs, n, axis=1)
            out = env.step(p, slates)
            rewards[episodes, :, p] += out.engagement.reshape(at_once, users)
            done = out.done
    rewards = rewards[: config.episodes]
    return RunResult(
        algorithm=policy,
        config=config.to_dict(),
        episode_rewards=rewards,
        seconds=time.perf_counter() - start,
        rounds=config.episodes * config.steps_per_platform,
        learn_steps=0,
    )


# --------------------------------------------------------------------------------------------
# The FedSlate run: its state, acting, learning, evaluation, and the loop


def on_candidates_of(x_other, x_target, num_candidates: int):
    """Platform features ``x_other`` with the candidate block of ``x_target`` (item alignment).

    State features are ``[sat, N candidate features, history...]``
    (``securefed.rl.slateq.features``);
    works on numpy arrays and torch tensors alike.
    """
    docs = slice(1, 1 + num_candidates)
    if isinstance(x_other, torch.Tensor):
        return torch.cat([x_other[..., :1], x_target[..., docs], x_other[..., docs.stop :]], -1)
    return np.concatenate([x_other[..., :1], x_target[..., docs], x_other[..., docs.stop :]], -1)


@dataclass(eq=False)
class FedSlateRun:
    """Everything a FedSlate run changes as it goes (built by :func:`start_run`).

    Attributes:
        config: the run's configuration.
        names: party names of the platforms (``"A"``, ``"B"``, ...).
        env: the simulator (``members`` users side by side).
        choice: the agents' choice model.
        local, local_target, local_opt: per platform, its Q-network, the target copy and the
            optimiser (the parties' side).
        channel: the fusion channel to the server: it holds the server network, its target copy
            and its optimiser (checkpointed with the parties' state) and records what the
            server saw in ``channel.view``.
        replay: the round-aligned replay buffer.
        act_rng, replay_rng: exploration and replay sampling streams.
        rewards: ``(episodes, members, platforms)`` episode rewards so far.
        rounds, learn_steps: rounds played and learning steps taken.
        updates: optimiser steps per network.
        timings: seconds spent acting and learning.
        start: ``time.perf_counter()`` at the (virtual) start of the run.
        dp_noise: per platform, the stream its DP channel noises from (empty without DP).
        local_dp: per platform, its local network's DP-SGD (empty without local DP).
        replay_unit: ``(buffer_size,)`` the episode (the unit) of each replay row.
        platform_tap: ``None``, or the platforms' own record of every acting inquiry,
            ``(round, {party: the Q-values it sent}, {party: the fused values it got})`` with
            ``(S, 1, N)`` arrays: what the platforms hold in the clear under an encrypted
            transport (the scorer's truth for the leak measures; never the server's view).
    """

    config: FedSlateConfig
    names: tuple[str, ...]
    env: ChocKaleBatch
    choice: ChoiceModel
    local: list[nn.Module]
    local_target: list[nn.Module]
    local_opt: list[torch.optim.Optimizer]
    channel: ModuleFusionChannel
    replay: ReplayBuffer
    act_rng: np.random.Generator
    replay_rng: np.random.Generator
    rewards: np.ndarray
    rounds: int = 0
    learn_steps: int = 0
    updates: dict[str, int] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)
    start: float = 0.0
    dp_noise: dict[str, np.random.Generator] = field(default_factory=dict)
    local_dp: list[LocalDPSGD] = field(default_factory=list)
    local_dp_noise: dict[str, np.random.Generator] = field(default_factory=dict)
    local_dp_sample: dict[str, np.random.Generator] = field(default_factory=dict)
    replay_unit: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    platform_tap: list | None = None

    @property
    def with_rewards(self) -> list[int]:
        """Platforms that learn from their own rewards (Algorithm 1, or 4)."""
        return [p for p, f in enumerate(self.config.feedback) if f]

    @property
    def without_rewards(self) -> list[int]:
        """Platforms that learn from the team target (Algorithm 2)."""
        return [p for p, f in enumerate(self.config.feedback) if not f]

    def training_state(self) -> TrainingState:
        """The run's mutable state by name, for checkpoints (:mod:`securefed.rl.checkpoint`)."""
        k_plat, channel = self.config.num_platforms, self.channel
        return TrainingState(
            stateful={f"local.{p}": self.local[p] for p in range(k_plat)}
            | {f"local_target.{p}": self.local_target[p] for p in range(k_plat)}
            | {f"local_opt.{p}": self.local_opt[p] for p in range(k_plat)}
            | {"server": channel.module, "server_target": channel.target}
            | {"server_opt": channel.optimiser, "replay": self.replay}
            | {"fusion_view": FusionViewState(channel.view)},
            generators={"explore": self.act_rng, "replay": self.replay_rng}
            | {f"env.{k}": g for k, g in self.env.streams.named().items()}
            | {f"dp_noise.{k}": g for k, g in self.dp_noise.items()}
            | {f"local_dp_noise.{k}": g for k, g in self.local_dp_noise.items()}
            | {f"local_dp_sample.{k}": g for k, g in self.local_dp_sample.items()},
            arrays={"rewards": self.rewards, "replay_unit": self.replay_unit},
        )


def server_network(config: FedSlateConfig, generator: torch.Generator | None = None):
    """The server's fusion network as ``config`` describes it (the linear ablation keeps the
    first hidden width and drops the activation)."""
    linear = config.variant == "linear"
    return ServerNetwork(
        config.members,
        config.num_platforms,
        config.num_candidates,
        config.server_hidden[:1] if linear else config.server_hidden,
        arch=config.server_arch,
        activation=config.server_hidden_activation,
        output_activation=config.output_activation,
        generator=generator,
    )


def ckks_config(config: FedSlateConfig):
    """The CKKS channel's parameters for ``config`` (``None`` for other channels): the output
    gradients of FedSlate's Huber losses are bounded by ``huber_delta``; Q-values by
    :data:`CKKS_Q_BOUND` (a platform refuses to encrypt a larger one, ending the run)."""
    if config.fusion not in ENCRYPTED_FUSIONS:
        return None
    from securefed.fusion.ckks_module import CKKSModuleConfig

    # One hidden layer (or the linear ablation): degree <= 2, the packed circuit.
    packed = config.variant == "linear" or len(config.server_hidden) == 1
    default = CKKS_SCALE_BITS if packed else CKKS_MONOMIAL_SCALE_BITS
    scale = default if config.ckks_scale_bits is None else config.ckks_scale_bits
    return CKKSModuleConfig(
        value_bound=CKKS_Q_BOUND,
        grad_bound=max(1.0, config.huber_delta),
        scale_bits=scale,
        circuit="packed" if packed else "monomials",
    )


ENCRYPTED_FUSIONS = ("ckks", "ckks+dp")
"""The transports under which the server sees ciphertexts only."""
CKKS_DP_CLAMP_SIGMAS = 4.0
"""Under ``ckks+dp``, ``c`` of the public clamp bound ``B = clip + c * std`` of the noised
Q-values (and gradients): an entry is clamped with probability at most ``2 Phi(-4) = 6.3e-5``
(the channel reports the rate)."""
CKKS_SCALE_BITS = 49
"""FedSlate's CKKS scale (``ckks_scale_bits=None``) with one hidden server layer: the packed
circuit (:mod:`securefed.fusion.ckks_packed`) at ring 8192, chain ``[60, 49, 49, 60]``; the
owner's ciphertexts are encrypted with its secret key, so the 20-bit flooding of a released batch
sum stays near the 2^55 monomial circuit's std at :data:`CKKS_Q_BOUND` (docs/fedslate.md
section 7)."""
CKKS_MONOMIAL_SCALE_BITS = 55
"""The scale of the monomial circuit (two or more hidden layers): at 2^55 the 20-bit flooding of a
released batch sum has std 4.5e-3 at :data:`CKKS_Q_BOUND` (73 at 2^40); ring 16384, chain
``[60, 55, 55, 55, 60]``, a learning step at (10, 3), 3 members, batch 32 about 0.9 s of CPU."""
CKKS_Q_BOUND = 64.0
"""Public bound on a platform's Q-values under CKKS. Returns are near 1.5 at the default reward
scale, but a platform without rewards drifts: B's Q-values passed 8 after 65 episodes of a
(10, 3) run (docs/fedslate.md); the flooding's error bound grows with its square."""


def start_run(config: FedSlateConfig, keep_payloads: RoundSelection = NO_PAYLOADS) -> FedSlateRun:
    """A fresh run: environment, the parties' networks, the fusion channel, replay, streams.

    Raises:
        FusionNotApplicable: the configuration's fusion channel cannot serve the server network.
    """
    cfg_env = config.env_config()
    tree = SeedTree(config.seed)
    k_plat = config.num_platforms
    names = PLATFORM_NAMES[:k_plat]
    env = ChocKaleBatch(
        cfg_env,
        config.members,
        EnvStreams.from_tree(tree, k_plat, "env", shared_corpus=config.shared_corpus),
    )
    dims = [cfg_env.state_dim(p) for p in range(k_plat)]
    # Parties: a local network (and its target copy and optimiser) per platform.
    local, local_target, local_opt = [], [], []
    for p in range(k_plat):
        net = local_network(config, dims[p], torch_generator(tree, "init", "local", p))
        target = local_network(config, dims[p])
        target.load_state_dict(net.state_dict())
        target.requires_grad_(False)
        local.append(net)
        local_target.append(target)
        local_opt.append(torch.optim.Adam(net.parameters(), lr=config.lr, fused=True))
    # Server: the fusion network, its target copy and its optimiser, behind the channel.
    server = server_network(config, torch_generator(tree, "init", "server"))
    server_opt = torch.optim.Adam(server.parameters(), lr=config.server_lr or config.lr, fused=True)
    # Under DP each platform noises its rows from its own stream (seeded: benchmarks only).
    dp_noise = (
        {name: tree.generator("fusion-dp", name) for name in names}
        if config.fusion in DP_CHANNELS
        else {}
    )
    channel = build_fusion_channel(
        config.fusion,
        names,
        server,
        server_opt,
        config.fusion_needs(),
        target=server_network(config),
        cross=config.variant != "fedq",
        keep_payloads=keep_payloads,
        total_rounds=config.episodes * config.steps_per_platform,
        seeds=tree if config.fusion in ENCRYPTED_FUSIONS else None,
        ckks_config=ckks_config(config),
        dp=config.dp_options() if dp_noise else None,
        noise=dp_noise or None,
    )
    if config.dp_diagnostic == "noiseless-rows":
        channel.noise_multiplier = 0.0  # a diagnostic: rows clipped, not noised (no epsilon)
    local_dp_noise = (
        {name: tree.generator("local-dp", name) for name in names} if config.local_dp else {}
    )
    # Under dp_sampling each platform draws its sample from its own secret stream (seeded:
    # benchmarks only, like the noise).
    samplers = (
        {name: tree.generator("local-dp-sample", name) for name in names}
        if config.dp_sampling is not None
        else None
    )
    local_dp = start_local_dp(config, channel, local, local_dp_noise, samplers)
    return FedSlateRun(
        config=config,
        names=names,
        env=env,
        choice=make_choice_model(config.choice_model),
        local=local,
        local_target=local_target,
        local_opt=local_opt,
        channel=channel,
        replay=ReplayBuffer(config.buffer_size, config.members, dims, config.slate_size),
        act_rng=tree.generator("agent", "explore"),
        replay_rng=tree.generator("agent", "replay"),
        rewards=np.zeros((config.episodes, config.members, k_plat)),
        updates={f"local_{names[p]}": 0 for p in range(k_plat)} | {"server": 0},
        timings={"acting": 0.0, "learning": 0.0},
        dp_noise=dp_noise,
        local_dp=local_dp,
        local_dp_noise=local_dp_noise,
        local_dp_sample=samplers or {},
        replay_unit=np.zeros(config.buffer_size, np.int64),
    )


def start_local_dp(
    config: FedSlateConfig,
    channel,
    local: list[nn.Module],
    noise: dict[str, np.random.Generator],
    samplers: dict[str, np.random.Generator] | None = None,
) -> list[LocalDPSGD]:
    """Each platform's :class:`LocalDPSGD`, its whole schedule charged to the platform's ledger
    (beside the fusion rows the channel charged) before anything is released; records the
    mechanism in the view. Without local DP-SGD under a DP transport the view says that the
    epsilon is not established.

    Raises:
        PrivacyBudgetExceeded: the fusion rows and the local steps together overrun a budget.
    """
    if config.dp_epsilon is None:
        return []
    bound = dp_unit_releases(config)
    if not config.local_dp:
        refresh_dp_public(config, channel, None)
        return []
    sigma = dp_noise_multipliers(
        config,
        releases=bound["releases"],
        local_steps=bound["local_steps"],
        tail=bound["tail_delta"],
    )["local"]
    trainers = []
    released = 0.0 if config.dp_diagnostic == "noiseless-local" else sigma  # diagnostic: no noise
    rate = config.dp_sample_rate
    for p, name in enumerate(channel.parties):
        if rate is None:
            channel.ledgers[name].charge(
                sigma, 1.0, steps=bound["local_steps"], server=(sigma, 1.0)
            )
        else:  # the sample is secret from the server and from the other platforms
            release = accounting.SampledReplaceGaussian(sigma, rate)
            channel.ledgers[name].charge_discrete(
                release, server=release, steps=bound["local_steps"]
            )
        trainers.append(
            LocalDPSGD(
                name,
                local[p],
                config.dp_local_clip,
                released,
                as_noise_source(noise[name]),
                sample_rate=rate,
                sampler=None if rate is None else samplers[name],
                server_clip=config.dp_server_clip,
            )
        )
    refresh_dp_public(config, channel, trainers)
    return trainers


def refresh_dp_public(config: FedSlateConfig, channel, trainers: list[LocalDPSGD] | None):
    """The view's ``public["dp"]``: the channel's mechanism and ledgers, and the local
    training's (DP-SGD's parameters, or the flag that the epsilon is not established)."""
    public = channel.public()
    if trainers is None:
        public["local_training"] = (
            "none: the local networks train on raw data, so one unit moves every later row; "
            "the epsilon is not established (epsilon_fusion_rows_only counts the fusion rows)"
        )
        public["epsilon_fusion_rows_only"] = public["epsilon_spent"]
        public["epsilon_spent"] = {p: None for p in channel.parties}
    else:
        bound = dp_unit_releases(config)
        sigma = trainers[0].noise_multiplier if trainers else None
        public["local_training"] = "dp-sgd"
        public["learning"] = (
            "sums: one DP-SGD sum per platform and learning step (local and server weights); "
            "no fusion row released (the rows' noise fields are unused)"
            if config.dp_learning == "sums"
            else "rows"
        )
        # One user's episode is a unit on every platform: against the server, which sees every
        # platform's rows, the user's loss is their composition (one tail event: the replay
        # draws are shared).
        every = [t for p in channel.parties for t in channel.ledgers[p].server_history]
        curves = [r for p in channel.parties for r in channel.ledgers[p].server_discrete_history]
        public["epsilon_user_all_platforms"] = epsilon_with_discrete(
            every, curves, config.dp_delta - bound["tail_delta"]
        )
        public["local_sgd"] = {
            "noise_multiplier": sigma,
            "clip": config.dp_local_clip,
            "sensitivity": fusion_dp.REPLACEMENT_SENSITIVITY * config.dp_local_clip,
            "noise_std": None if sigma is None else sigma * 2 * config.dp_local_clip,
            "steps_per_unit": bound["local_steps"],
            "sampling": config.dp_sampling,
            "sample_rate": config.dp_sample_rate,
            "server_clip": config.dp_server_clip,
            "local_part_clip": (
                None
                if config.dp_server_clip is None
                else math.sqrt(config.dp_local_clip**2 - config.dp_server_clip**2)
            ),
        }
    if config.dp_diagnostic is not None:
        public["diagnostic"] = (
            f"{config.dp_diagnostic}: one mechanism releases without noise, a measurement of "
            "what the other costs, not a private run (the epsilon is not established; "
            "epsilon_if_noised is what the ledger would have spent)"
        )
        public["epsilon_if_noised"] = public["epsilon_spent"]
        public["epsilon_spent"] = {p: None for p in channel.parties}
    channel.view.public["dp"] = public


def seen_by(config: FedSlateConfig, xs: Sequence, q: int, p: int):
    """Platform q's features as they enter platform p's fusion (item alignment: p's docs)."""
    if config.alignment == "item" and q != p:
        return on_candidates_of(xs[q], xs[p], config.num_candidates)
    return xs[q]


# -- acting (Algorithm 3) -----------------------------------------------------------------------


def acting_inquiry(run: FedSlateRun, x: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The round's inquiry: every platform's fused values ``Qf_p`` ``(S, N)`` on its frozen
    observation, one fusion for all platforms (item alignment: one per platform, each on that
    platform's candidates)."""
    config, names, local = run.config, run.names, run.local
    k_plat = config.num_platforms
    if config.dp_acting == "own":
        return own_acting_values(run, x)
    if config.alignment == "item":
        qf = {}
        for p in range(k_plat):
            msgs = {
                names[q]: local[q].numpy_forward(seen_by(config, x, q, p)[:, None, :])
                for q in range(k_plat)
            }
            qf |= _acting_fusion(run, msgs, [names[p]])
        return qf
    msgs = {names[p]: local[p].numpy_forward(x[p][:, None, :]) for p in range(k_plat)}
    return _acting_fusion(run, msgs, list(names))


def own_acting_values(run: FedSlateRun, x: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Joint DP acting (``dp_acting="own"``): each platform evaluates the server network's
    current weights on its own clean Q-values, the others' inputs at 0 (the mean of the noised
    rows the server network trains on); nothing is sent. The weights are a post-processing of
    the charged learning releases, so the slate a user gets is a function of those releases and
    of the platform's own data of that user only."""
    server, k_plat = run.channel.module, run.config.num_platforms
    out = {}
    for p, name in enumerate(run.names):
        own = run.local[p].numpy_forward(x[p][:, None, :])
        zeros = np.zeros_like(own)
        out[name] = server.numpy_forward([own] + [zeros] * (k_plat - 1))[:, 0]
    return out


def _acting_fusion(
    run: FedSlateRun, msgs: dict[str, np.ndarray], outputs: list[str]
) -> dict[str, np.ndarray]:
    fused = run.channel.forward(msgs, outputs=outputs, train=False, tag=ACT)
    if run.platform_tap is not None:
        sent = {p: np.array(msgs[p]) for p in outputs}
        got = {p: np.array(np.asarray(v)) for p, v in fused.items()}
        if run.platform_tap and run.platform_tap[-1][0] == run.rounds:
            run.platform_tap[-1][1].update(sent)  # item alignment: one exchange per platform
            run.platform_tap[-1][2].update(got)
        else:
            run.platform_tap.append((run.rounds, sent, got))
    return {k: np.asarray(v)[:, 0] for k, v in fused.items()}


def padded_features(xs: list[np.ndarray]) -> list[np.ndarray]:
    """The platforms' feature arrays padded to one width (choice weights read columns ``0..N``
    only, which every platform's features share)."""
    width = max(a.shape[1] for a in xs)
    return [np.pad(a, ((0, 0), (0, width - a.shape[1]))) for a in xs]


def choose_slates(
    run: FedSlateRun, x: list[np.ndarray], qf: dict[str, np.ndarray], eps: float
) -> np.ndarray:
    """``(K, S, n)`` every platform's epsilon-greedy slate from the round's inquiry, selected in
    one batch (rows ``p * S + s``)."""
    config = run.config
    x_all = np.concatenate(padded_features(x))
    v, v_null = choice_weights(run.choice, x_all, config.num_candidates)
    q_all = np.concatenate([qf[name] for name in run.names])
    slates_all = select_slates(config.slate_method, q_all, v, v_null, config.slate_size)
    slates_all = explore(slates_all, eps, run.act_rng, config.num_candidates)
    return slates_all.reshape(config.num_platforms, config.members, config.slate_size)


def play_round(run: FedSlateRun, episode: int, x: list[np.ndarray], slates: np.ndarray) -> bool:
    """The platforms take their turns with the shared user; rewards and replay are written and
    ``x`` is advanced in place. Returns whether the episode ended."""
    done = False
    for p in range(run.config.num_platforms):
        out = run.env.step(p, slates[p])
        run.rewards[episode, :, p] += out.engagement
        x_next = features(run.env.observation(p), run.config)
        run.replay.add(p, x[p], slates[p], out.clicked, out.feedback, x_next)
        x[p] = x_next
        done = out.done
    return done


# -- learning (Algorithms 1 and 2) --------------------------------------------------------------


def td_targets(
    run: FedSlateRun, idx: np.ndarray, done: np.ndarray
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """Step 1: ``Y_p = r_p + gamma X_p(s'_p) (1 - done)`` on the target networks, for each
    platform with rewards; returns ``(Y_p, valid_p)`` (valid: the platform observed feedback)."""
    config, names, replay = run.config, run.names, run.replay
    k_plat = config.num_platforms
    sarsa = config.target == "sarsa"
    targets_y, valid = {}, {}
    with torch.no_grad():
        x_next = [replay.gather(replay.x_next, p, idx) for p in range(k_plat)]

        def next_messages(p: int) -> dict[str, torch.Tensor]:
            return {
                names[q]: run.local_target[q](torch.from_numpy(seen_by(config, x_next, q, p)))
                for q in range(k_plat)
            }

        shared_next = None if config.alignment == "item" else next_messages(0)  # same for all p
        for p in run.with_rewards:
            q_next = shared_next if shared_next is not None else next_messages(p)
            fused = run.channel.forward(
                q_next, outputs=[names[p]], network="target", train=False, tag=TARGET
            )
            qf_next = fused[names[p]].numpy()
            nxt = replay.gather(replay.next_slate, p, idx) if sarsa else None
            x_val = next_values(config, run.choice, qf_next, x_next[p], nxt)
            fb = replay.gather(replay.feedback, p, idx)
            valid[p] = ~np.isnan(fb)
            y = np.where(valid[p], fb, 0.0) * config.reward_scale
            targets_y[p] = (y + config.gamma * x_val * ~done).astype(np.float32)
    return targets_y, valid


def clicked_loss(
    fused: torch.Tensor, positions: torch.Tensor, *, y: torch.Tensor, mask: torch.Tensor, delta
) -> torch.Tensor:
    """Algorithm 1's loss: ``Huber(Qf_p(s, clicked), Y_p)`` (``fused`` holds the clicked one)."""
    return masked_huber(fused[..., 0], y, mask, delta)


def slate_value_loss(
    fused: torch.Tensor,
    slates: torch.Tensor,
    *,
    v: torch.Tensor,
    v_null: torch.Tensor,
    y: torch.Tensor,
    mask: torch.Tensor,
    delta: float,
) -> torch.Tensor:
    """Algorithm 2's loss: ``Huber(V_B(s_B), team target)`` with ``V_B = sum_j P(j) Qf_B(j)``
    over B's greedy slate (``fused`` holds ``Qf_B`` at the slate's positions)."""
    chosen_v = torch.gather(v, 2, slates)
    probs = chosen_v / (v_null[..., None] + chosen_v.sum(dim=2, keepdim=True))
    value = (probs * fused).sum(dim=2)
    return masked_huber(value, y, mask, delta)


def greedy_positions(
    run: FedSlateRun,
    p: int,
    v: np.ndarray,
    v_null: np.ndarray,
    msgs: dict[str, torch.Tensor],
) -> torch.Tensor:
    """B's greedy slate on ``Qf_B`` from the networks as updated so far this step (an
    evaluation-only fusion of the detached Q-values)."""
    config, name = run.config, run.names[p]
    qf = run.channel.forward(msgs, outputs=[name], train=False, tag=SELECT)[name].numpy()
    s_, b_ = qf.shape[:2]
    n_cand = config.num_candidates
    slates = select_slates(
        config.slate_method,
        qf.reshape(s_ * b_, n_cand),
        v.reshape(s_ * b_, n_cand),
        v_null.reshape(s_ * b_),
        config.slate_size,
    )
    return torch.from_numpy(slates.reshape(s_, b_, config.slate_size))


def exchange_update(
    run: FedSlateRun,
    p: int,
    loss_of: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    xs: list[torch.Tensor],
    positions: torch.Tensor | Callable[[dict[str, torch.Tensor]], torch.Tensor],
    units: np.ndarray | None = None,
) -> None:
    """One update of platform ``p``'s network and the server through the fusion channel.

    The other platforms' networks are frozen (their Q-values are inputs). ``positions``: the
    candidate positions whose fused values ``p``'s loss needs, or a function that picks them
    from the (detached) Q-value messages (B's greedy slate). The exchange: Q-values up, ``Qf_p``
    at those positions down, ``dL/dQf_p`` up (the server steps), ``dL/dQ_p`` down.

    Under a DP transport the positions (A's clicked candidates, B's greedy slate on its own
    choice weights) are the platform's data: it asks for every position's fused value and
    picks its own locally, and its gradient row covers every position. With local DP-SGD
    (``run.local_dp``) the platform steps its network on the clipped, noised sum of its units'
    gradients (``units``: ``(S, B)`` the unit of each row).
    """
    config, names, channel = run.config, run.names, run.channel
    private = config.dp_epsilon is not None
    own = run.local[p](xs[p])
    msgs = {names[p]: own}
    with torch.no_grad():
        for q in range(config.num_platforms):
            if q != p:
                msgs[names[q]] = run.local[q](seen_by(config, xs, q, p))
    if callable(positions):
        positions = positions({k: m.detach() for k, m in msgs.items()})
    asked = None if private else {names[p]: positions}
    fused = channel.forward(msgs, outputs=[names[p]], positions=asked, train=True, tag=LEARN)[
        names[p]
    ]
    fused = fused.requires_grad_(True)  # what party p received
    chosen = torch.gather(fused, 2, positions) if private else fused
    loss = loss_of(chosen, positions)
    run.local_opt[p].zero_grad(set_to_none=True)
    loss.backward()
    grads = channel.backward({names[p]: fused.grad}, recipients=[names[p]])
    if run.local_dp:
        if units is None:
            raise ValueError("local DP-SGD needs the unit of every row")
        run.local_dp[p].step(run.local_opt[p], xs[p], grads[names[p]], units)
    else:
        own.backward(grads[names[p]])
        run.local_opt[p].step()
    run.updates[f"local_{names[p]}"] += 1
    run.updates["server"] += 1


def learn(run: FedSlateRun) -> None:
    """One learning step on a replay batch of rounds shared by every platform: the targets,
    Algorithm 1 for the platforms with rewards, Algorithm 2 for the others."""
    if run.config.dp_learning == "sums":
        learn_sums(run)
        return
    config, replay = run.config, run.replay
    k_plat, n_cand, delta = config.num_platforms, config.num_candidates, config.huber_delta
    idx = replay.sample(run.replay_rng, config.batch_size, config.target == "sarsa")
    units = run.replay_unit[idx]
    xs = [torch.from_numpy(replay.gather(replay.x, p, idx)) for p in range(k_plat)]
    if run.with_rewards and getattr(run.channel, "announces", False):
        # The first Algorithm-1 forward's Q-values, sent ahead of the targets' forward (the
        # packed CKKS circuit evaluates both in one ciphertext; the DP wrapper has no such hook).
        first = run.with_rewards[0]
        with torch.no_grad():
            msgs = {
                run.names[q]: run.local[q](seen_by(config, xs, q, first)) for q in range(k_plat)
            }
        run.channel.announce(msgs, outputs=[run.names[first]])
    targets_y, valid = td_targets(run, idx, replay.done[idx])
    # 2. Algorithm 1 for each platform with rewards: Huber(Qf_p(s, clicked), Y_p).
    for p in run.with_rewards:
        clicked = torch.from_numpy(replay.gather(replay.clicked, p, idx))[..., None]
        y_t, m_t = torch.from_numpy(targets_y[p]), torch.from_numpy(valid[p])
        loss = partial(clicked_loss, y=y_t, mask=m_t, delta=delta)
        exchange_update(run, p, loss, xs, clicked, units)
    if not run.without_rewards:
        return
    # 3. Algorithm 2 for each platform without rewards: V_B(s_B) onto the team target.
    stack_y = np.stack([targets_y[p] for p in run.with_rewards])
    stack_m = np.stack([valid[p] for p in run.with_rewards])
    team_valid = stack_m.any(axis=0)
    team_y = (stack_y * stack_m).sum(axis=0) / np.maximum(stack_m.sum(axis=0), 1)
    y_t, m_t = torch.from_numpy(team_y.astype(np.float32)), torch.from_numpy(team_valid)
    for p in run.without_rewards:
        v, v_null = choice_weights(run.choice, xs[p].numpy(), n_cand)
        loss = partial(
            slate_value_loss,
            v=torch.from_numpy(v.astype(np.float32)),
            v_null=torch.from_numpy(v_null.astype(np.float32)),
            y=y_t,
            mask=m_t,
            delta=delta,
        )
        exchange_update(run, p, loss, xs, partial(greedy_positions, run, p, v, v_null), units)


def learn_sums(run: FedSlateRun) -> None:
    """A learning step under ``dp_learning="sums"``: every platform trains the server network
    as it acts with it (its own clean Q-values first, the others' inputs at 0) and releases one
    DP-SGD sum of its units' clipped gradients in both networks' weights.

    The steps of :func:`learn`, each computed by the platform on its own data: the TD targets
    ``Y_p`` of the platforms with rewards on their target networks (the target server network
    on ``[Q'_p(s'), 0]``), Algorithm 1's loss for them and Algorithm 2's (B's greedy slate on its
    own fused values, onto the team target) for the others, then
    :meth:`LocalDPSGD.step_joint` per platform in turn (the server steps on each release's
    server part, as it steps once per platform's update in :func:`learn`). Nothing goes through
    the fusion channel; the server receives the noised sums' server parts only.
    """
    config, replay = run.config, run.replay
    k_plat, n_cand, delta = config.num_platforms, config.num_candidates, config.huber_delta
    sarsa = config.target == "sarsa"
    idx = replay.sample(run.replay_rng, config.batch_size, sarsa)
    units = run.replay_unit[idx]
    done = replay.done[idx]
    xs = [torch.from_numpy(replay.gather(replay.x, p, idx)) for p in range(k_plat)]
    server, target = run.channel.module, run.channel.target

    def alone(q: torch.Tensor) -> list[torch.Tensor]:
        return [q] + [torch.zeros_like(q)] * (k_plat - 1)

    targets_y, valid = {}, {}
    with torch.no_grad():
        for p in run.with_rewards:
            x_next = replay.gather(replay.x_next, p, idx)
            q_next = run.local_target[p](torch.from_numpy(x_next))
            qf_next = target(alone(q_next)).numpy()
            nxt = replay.gather(replay.next_slate, p, idx) if sarsa else None
            x_val = next_values(config, run.choice, qf_next, x_next, nxt)
            fb = replay.gather(replay.feedback, p, idx)
            valid[p] = ~np.isnan(fb)
            y = np.where(valid[p], fb, 0.0) * config.reward_scale
            targets_y[p] = (y + config.gamma * x_val * ~done).astype(np.float32)
    for p in run.with_rewards:
        clicked = torch.from_numpy(replay.gather(replay.clicked, p, idx))[..., None]

        def loss_a(fused, clicked_row, y_row, m_row):
            chosen = torch.gather(fused, 2, clicked_row)
            return clicked_loss(chosen, clicked_row, y=y_row, mask=m_row, delta=delta)

        extras = (clicked, torch.from_numpy(targets_y[p]), torch.from_numpy(valid[p]))
        run.local_dp[p].step_joint(run, p, loss_a, xs[p], extras, units)
    if not run.without_rewards:
        return
    stack_y = np.stack([targets_y[p] for p in run.with_rewards])
    stack_m = np.stack([valid[p] for p in run.with_rewards])
    team_valid = stack_m.any(axis=0)
    team_y = (stack_y * stack_m).sum(axis=0) / np.maximum(stack_m.sum(axis=0), 1)
    y_t, m_t = torch.from_numpy(team_y.astype(np.float32)), torch.from_numpy(team_valid)
    for p in run.without_rewards:
        v, v_null = choice_weights(run.choice, xs[p].numpy(), n_cand)
        with torch.no_grad():  # B's greedy slate on its own fused values, chosen locally
            qf = server(alone(run.local[p](xs[p]))).numpy()
        s_, b_ = qf.shape[:2]
        slates = select_slates(
            config.slate_method,
            qf.reshape(s_ * b_, n_cand),
            v.reshape(s_ * b_, n_cand),
            v_null.reshape(s_ * b_),
            config.slate_size,
        )
        slates_t = torch.from_numpy(slates.reshape(s_, b_, config.slate_size))

        def loss_b(fused, slate_row, v_row, v_null_row, y_row, m_row):
            chosen = torch.gather(fused, 2, slate_row)
            return slate_value_loss(
                chosen, slate_row, v=v_row, v_null=v_null_row, y=y_row, mask=m_row, delta=delta
            )

        extras = (
            slates_t,
            torch.from_numpy(v.astype(np.float32)),
            torch.from_numpy(v_null.astype(np.float32)),
            y_t,
            m_t,
        )
        run.local_dp[p].step_joint(run, p, loss_b, xs[p], extras, units)


def sync_targets(run: FedSlateRun) -> None:
    """The target networks take the online weights (every ``target_sync`` rounds)."""
    for p in range(run.config.num_platforms):
        run.local_target[p].load_state_dict(run.local[p].state_dict())
    run.channel.sync_target()


# -- evaluation ---------------------------------------------------------------------------------


def report_progress(run: FedSlateRun, episode: int) -> None:
    """Every ``log_every`` episodes: the mean reward per platform over the last ones."""
    config = run.config
    if not config.log_every or (episode + 1) % config.log_every:
        return
    window = run.rewards[max(0, episode - config.log_every + 1) : episode + 1]
    print(
        f"fedslate[{config.variant}] episode {episode + 1}: mean reward per platform "
        f"{np.round(window.mean(axis=(0, 1)), 1)}, eps {config.epsilon(run.rounds):.3f}, "
        f"{time.perf_counter() - run.start:.0f}s",
        flush=True,
    )


def run_result(run: FedSlateRun) -> RunResult:
    """What the run produced (the channel's view included)."""
    k_plat, names = run.config.num_platforms, run.names
    if "dp" in run.channel.view.public:  # the spent budget, clamp rates
        trainers = run.local_dp if run.config.local_dp else None
        refresh_dp_public(run.config, run.channel, trainers)
    return RunResult(
        algorithm=run.config.variant,
        config=run.config.to_dict(),
        episode_rewards=run.rewards,
        seconds=time.perf_counter() - run.start,
        rounds=run.rounds,
        learn_steps=run.learn_steps,
        updates=run.updates,
        timings=run.timings,
        networks={f"local_{names[p]}": run.local[p] for p in range(k_plat)}
        | {"server": run.channel.module},
        fusion_view=run.channel.view,
        fusion_clean=(
            run.platform_tap
            if run.platform_tap is not None
            else getattr(run.channel, "clean_inputs", None)
        ),
    )


# -- the loop -----------------------------------------------------------------------------------


def run_fedslate(
    config: FedSlateConfig,
    checkpoints: EpisodeCheckpoints | None = None,
    *,
    keep_payloads: RoundSelection = NO_PAYLOADS,
    keep_clean: bool = False,
    on_reset: Callable[[ChocKaleBatch, int], None] | None = None,
) -> RunResult:
    """Train FedSlate (or a variant) and return the per-platform episode rewards.

    The server network runs behind the fusion channel ``config.fusion``
    (:mod:`securefed.fusion.registry`); the channel's view (``result.fusion_view``) records what
    the server saw, every exchange tagged :data:`ACT`, :data:`TARGET`, :data:`LEARN` or
    :data:`SELECT`. Sets no global state: callers choose torch's threads
    (``config.threads``).

    Args:
        config: the run's configuration.
        checkpoints: save the run's state at episode boundaries and resume from it
            (:mod:`securefed.rl.checkpoint`; the view is part of the state); ``None``: none.
        keep_payloads: which rounds of the view keep every vector (rounds are numbered from 0
            over the run; ``ALL_PAYLOADS`` for the Q-value attack).
        keep_clean: under a DP transport, keep the acting inquiries' Q-values before noise in
            ``result.fusion_clean`` (to score a leak against them; benchmarks only); under an
            encrypted one (:data:`ENCRYPTED_FUSIONS`), the platforms' own record of every
            inquiry, ``(round, {party: Q-values sent}, {party: fused values got})``.
        on_reset: called with the simulator and the episode after each episode's users are
            drawn (the empirical audit's canary users,
            :mod:`securefed.attacks.fedslate_canaries`; ``None``: nothing).

    Raises:
        FusionNotApplicable: the fusion channel cannot serve this configuration (before any
            episode).
        ValueError: ``keep_clean`` without a DP transport (the view holds the clean values).
    """
    tapped = sorted({*DP_CHANNELS, *ENCRYPTED_FUSIONS})
    if keep_clean and config.fusion not in tapped:
        raise ValueError(
            f"keep_clean applies to the DP and encrypted transports {tapped}; under "
            f"{config.fusion!r} the view itself holds the Q-values as sent"
        )
    run = start_run(config, keep_payloads)
    if keep_clean and config.fusion in ENCRYPTED_FUSIONS:
        run.platform_tap = []
    elif keep_clean:
        run.channel.keep_clean = (ACT,)
    state = run.training_state()
    resumed = resume_counters(state, checkpoints, config.variant, config)
    first_episode, run.rounds, run.learn_steps = (
        resumed[k] for k in ("episodes", "rounds", "learn")
    )
    run.updates |= resumed["updates"]
    run.timings |= resumed["timings"]
    run.start = time.perf_counter() - resumed["seconds"]
    for episode in range(first_episode, config.episodes):
        run.env.reset()
        if on_reset is not None:
            on_reset(run.env, episode)
        x = [features(run.env.observation(p), config) for p in range(config.num_platforms)]
        done = False
        tock = time.perf_counter()
        while not done:
            run.channel.open_round(run.rounds)
            qf = acting_inquiry(run, x)
            slates = choose_slates(run, x, qf, config.epsilon(run.rounds))
            done = play_round(run, episode, x, slates)
            tick = time.perf_counter()
            run.timings["acting"] += tick - tock
            run.replay_unit[run.replay.head] = episode
            run.replay.commit(done)
            run.rounds += 1
            if run.rounds > config.burn_in and run.rounds % config.learn_every == 0:
                learn(run)
                run.learn_steps += 1
            if run.rounds % config.target_sync == 0:
                sync_targets(run)
            tock = time.perf_counter()
            run.timings["learning"] += tock - tick
        report_progress(run, episode)
        counters = {"episodes": episode + 1, "rounds": run.rounds, "learn": run.learn_steps}
        counters |= {"updates": run.updates, "timings": run.timings}
        counters["seconds"] = time.perf_counter() - run.start
        checkpoint_if_due(state, checkpoints, config.variant, config, counters)
    return run_result(run)
