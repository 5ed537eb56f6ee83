"""A real single-node Kubernetes cluster on this machine, for the cluster tests and drills.

``python -m devtools.cluster`` (``make cluster-up`` / ``cluster-deploy`` / ``cluster-smoke`` /
``cluster-down``) builds Kubernetes 1.34 from the Go module proxy, makes the images with
buildah from a debootstrap base, and runs etcd, the control plane, containerd + runc, a
kubelet, kube-proxy and CoreDNS as processes of this machine, with pods on a bridge that
has no uplink. See docs/kubernetes.md.
"""
