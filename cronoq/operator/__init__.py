"""cronoq.operator: a Kubernetes operator that scales worker Deployments
from their pool's desired capacity (extra ``cronoq[operator]``).

Each ``CronoqWorkerScaler`` (cronoq.io/v1alpha1) names a server of the
operator's configuration, a pool and a Deployment. Every ``intervalSeconds``
the operator reads the pool's ``desired`` slots from the server's snapshot
and sets the Deployment's replicas to ``ceil(desired / slotsPerReplica)``,
clamped to ``[minReplicas, maxReplicas]``, through its scale subresource;
when the server cannot be read or does not report the pool, it leaves the
Deployment alone and says why in the scaler's status.

The layers: ``spec`` and ``decide`` are pure (the scaler's fields, the
decision); ``reconcile`` is one pass over the seams ``PoolReader`` (the
server) and ``ClusterAPI`` (the Kubernetes calls); ``schedule`` says which
scalers are due; ``config`` reads the operator's file; ``reader`` and
``kube`` are the real seams; ``app`` is the kopf wiring.
"""

from .cluster import ClusterAPI, ClusterError, DeploymentNotFound
from .config import OperatorConfig, ServerEntry, load_config
from .decide import Decision, Reading, decide, replicas_for
from .reconcile import reconcile
from .spec import ScalerSpec, SpecError

__all__ = ["ClusterAPI", "ClusterError", "DeploymentNotFound", "OperatorConfig", "ServerEntry", "load_config",
           "Decision", "Reading", "decide", "replicas_for", "reconcile", "ScalerSpec", "SpecError"]
