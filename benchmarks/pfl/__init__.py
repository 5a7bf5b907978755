"""W1 (FedSoft) and W2 (FedAvg) in pfl's simulation: the pfl side of the seconds-per-round benchmark.

A package run by the pfl venv's python (see ``benchmarks/pfl_env.py``), from the folder above
``benchmarks/`` (or with it on ``PYTHONPATH``): it imports only the standard library, numpy, torch
and pfl (0.6.0, Apple's pfl-research), never ``raysoft``.

    <pfl-venv>/bin/python -m benchmarks.pfl --data W2.npz --out result.json [--workers 2]

Its modules, one concern each: :mod:`.cli` (the arguments, the one-line errors), :mod:`.launcher`
(starts and ends the ranks; standard library only), :mod:`.rank` (one rank: loads the data,
runs W1 or W2, writes the result), :mod:`.common` (what both workloads use: the data file's
fields, the random streams, a user's dataset, the round clock, the result, the torch module),
:mod:`.fedavg` (W2) and :mod:`.fedsoft` (W1). ``__main__`` imports the launcher, or (on a rank)
the rank's modules, which import numpy, torch and pfl: the launcher holds none of them.

The ``.npz`` is written by raysoft's bare loop (``bare_fedavg`` / ``bare_fedsoft`` in
``raysoft/bench/bare.py``); ``algorithm`` says which:

* ``fedavg`` (W2): as for Flower (``benchmarks/flower.py``): the clients' data (``x_<k>``,
  ``y_<k>``, ``num_clients``), every round's clients (``selection`` [rounds, K]), the initial
  CNN (``init_<i>`` in ``model.parameters()`` order), a test set (``x_test``, ``y_test``), the
  hyperparameters (``lr``, ``momentum``, ``batch_size``, ``local_epochs``, ``seed``,
  ``channels``, ``hidden``, ``classes``), and ``shuffle`` and ``shuffle_entropy``.
* ``fedsoft`` (W1): the clients' data (``x_<k>`` [n_k, d], ``y_<k>`` [n_k]), ``sizes``, the
  initial centers (``center_<s>``) and the clients' initial model (``client_init``) as flat
  vectors of the bias-free ``Linear(dim, 1)``, a holdout set per distribution
  (``x_test_<s>``, ``y_test_<s>``), ``num_clients``, ``num_centers``, ``num_distributions``,
  ``dim``, ``rounds``, ``clients_per_round`` (K per center), ``estimation_interval`` (tau),
  ``sigma``, ``prox_weight`` (lambda), ``lr`` (Adam), ``batch_size``, ``local_epochs``, ``seed``,
  ``select_entropy`` and ``shuffle_entropy``.

Random streams: client k's batch order in round t comes from
``np.random.default_rng(SeedSequence([*shuffle_entropy, k, t]))`` (a fresh permutation per
epoch), and W1's selection of round t from ``SeedSequence([*select_entropy, t])``: the streams
the bare loop draws from, so both run the same local steps on the same batches.

How pfl is used. Each client is a pfl user: a ``FederatedDataset`` whose user sampler names the
users of the next cohort, a ``Dataset`` per user (reshuffled at each epoch from the stream
above), a ``PyTorchModel``, a ``SimulatedBackend`` that runs the cohort through the algorithm's
``simulate_one_user`` and sums the users' statistics (all-reduced over the workers), and
``FederatedAlgorithm.run`` driving the central iterations.

* W2 is pfl's own ``FederatedAveraging`` with the ``WeightByDatapoints`` postprocessor (so the
  mean is weighted by n_k, as FedAvg's) and a central ``SGD(lr=1)`` applying the mean update,
  local ``SGD`` (lr, momentum) from ``PyTorchModel.do_multiple_epochs_of``. One change:
  pfl's ``FederatedNNAlgorithm`` evaluates every user of the cohort before and after its local
  training when ``iteration % evaluation_frequency == 0``, which is always true of iteration 0;
  the other systems evaluate no user, so the subclass here turns that off (the test accuracy is
  computed once, after the last round). The users of a round come from ``selection``: the
  sampler walks ``(client, round)`` pairs in that order and ``user_id_to_weight`` (n_k) lets
  pfl balance each cohort over the workers, as its docs advise for users of unequal sizes.
* W1's FedSoft is written here as a pfl algorithm (``FedSoft``, a ``FederatedAlgorithm``, the
  base pfl documents for custom algorithms; pfl has no FedSoft). The server (the algorithm
  object) keeps the S centers, the importance weights u [N, S] and the selection; the users
  do the rest. A FedSoft round is one or two central iterations of pfl: every tau-th round
  first an *estimation* iteration over all N users (each user counts n_ks, its samples whose
  lowest-loss center is s, and sends them as a row of an [N, S] statistic; the server sets
  u_ks = max(n_ks / n_k, sigma)), then a *training* iteration over the union of the clients
  each center drew (K per center, without replacement, with the probabilities of eq. (6),
  v_sk = u_ks n_k / sum_k' u_k's n_k'). A training user continues its own local model with its
  own Adam state (kept between rounds in pfl's ``DiskUserStateStorage``, which pfl documents for
  stateful users in multi-process simulations on one machine), minimising its MSE plus
  lambda/2 sum_s u_ks ||w - c_s||^2 through ``do_multiple_epochs_of`` with a train step like
  pfl's FedProx one, and sends its model into the sum of each center that selected it; the
  server's c_s is the mean of those (a center no client drew keeps its value).

  Where it differs from raysoft's bare loop: nowhere in the maths. The counts n_ks travel
  instead of u_k because pfl's all-reduce carries float32 and the counts are integers (exact),
  so the server's u is the bare loop's float64 u to the bit; the centers are sums in float32
  over the users (of each worker, then across workers) where the bare loop stacks and averages,
  so they agree to float32 rounding, which can grow over the rounds (and, in principle, move a
  sample whose two center losses nearly tie to the other center). Estimating is a central
  iteration of its own (pfl has one cohort query per context, and the training cohort depends
  on the estimate); both are timed as the one FedSoft round they make.

Workers: pfl's way to speed a simulation up is its distributed mode ("Fast distributed
simulations" in its docs): the users of a cohort are sharded over worker processes, each a
``torch.distributed`` (gloo) rank, whose sums are all-reduced, and the guide advises adding
processes per device until the speed-up stops. This machine has 2 cores and no GPU, so
``--workers 2`` (the default) runs two single-threaded ranks, one per core (``--workers 1``:
one rank with 2 torch threads). pfl's docs name two launchers: ``torchrun`` (preferred for
PyTorch) and the ``PFL_WORKER_ADDRESSES``/``PFL_WORKER_RANK`` environment variables. This
script uses the variables: run as above it is a launcher (standard library only) that starts
the ranks itself on 127.0.0.1 and a free port, so no torchrun agent (a further process that
imports torch only to wait: 0.5 GB PSS here) counts in pfl's memory; the ranks and what they
do are the same. Rank 0 writes the result. A rank that fails takes the others down (they
would wait in the all-reduce).

Timing: a round's seconds run from the end of the previous round (or the start of training) to
the end of the algorithm's central update of this round, as pfl's ``StopwatchCallback`` laps
its central iterations (rank 0's clock; the all-reduce makes the ranks finish together).
``total_s`` is the launcher's wall clock from starting the ranks to their exit (start-up,
loading the data, all rounds, the final evaluation). Memory is measured from outside, by
``raysoft bench``, over the launcher and all its descendants.

Output: a JSON file (``--out``) and its path as the last line of stdout; any failure exits 1
with a one-line error as the last line of stderr.
"""
