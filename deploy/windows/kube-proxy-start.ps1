# kube-proxy/start.ps1 of kproxy's Windows image: what a kube-proxy
# HostProcess DaemonSet runs (sig-windows-tools' kube-proxy-windows runs
# "$env:CONTAINER_SANDBOX_MOUNT_POINT/kube-proxy/start.ps1" with no
# arguments; its own script builds kube-proxy's command line), so that such
# a DaemonSet runs kproxy with only its image swapped.
#
# With arguments, they are kproxy's (kube-proxy's flags) and are passed to
# kproxy/start.ps1 as they are. Without, this script builds the command line
# sig-windows-tools' script gives kube-proxy, with kproxy's equivalents:
#   --proxy-mode=kernelspace
#   --hostname-override=$env:NODENAME, else $env:NODE_NAME (when set: the
#       current Calico DaemonSet sets NODENAME, older ones NODE_NAME)
#   --kubeconfig=<the kube-proxy ConfigMap's kubeconfig.conf>, the first of
#       $env:KUBEPROXY_KUBECONFIG and /var/lib/kube-proxy/kubeconfig.conf
#       that exists (kproxy/start.ps1 resolves it, and the paths it names,
#       under the sandbox mount point on containerd 1.6)
#   --v=$env:KUBEPROXY_V                          (when set)
# The HNS network is $env:KUBE_NETWORK when the DaemonSet sets it (older
# flannel ones did), which kproxy reads itself, else the network the node's
# CNI configuration names (Calico's: "Calico"), else the node's only
# L2Bridge or Overlay network; the overlay source VIP is $env:SOURCE_VIP if
# set (kproxy/start.ps1), else found by kproxy (Calico_ep, as the Calico
# script does, or reserved in the CNI's host-local store: docs/windows.md). kube-proxy's --feature-gates (WinOverlay, WinDSR) are
# not needed: kproxy has no feature gates.
$ErrorActionPreference = 'Stop'

$sandbox = "$env:CONTAINER_SANDBOX_MOUNT_POINT"
$start = Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/start.ps1'

if ($args.Count -gt 0) {
    & $start @args
    exit $LASTEXITCODE
}

$kproxyArgs = @('--proxy-mode=kernelspace')
$node = $env:NODENAME
if (-not $node) { $node = $env:NODE_NAME }
if ($node) {
    $kproxyArgs += "--hostname-override=$node"
}
$kubeconfig = $null
foreach ($candidate in @($env:KUBEPROXY_KUBECONFIG, '/var/lib/kube-proxy/kubeconfig.conf')) {
    if (-not $candidate) { continue }
    if ((Test-Path -LiteralPath $candidate) -or ($sandbox -and (Test-Path -LiteralPath (Join-Path $sandbox $candidate)))) {
        $kubeconfig = $candidate
        break
    }
}
if ($kubeconfig) {
    $kproxyArgs += "--kubeconfig=$kubeconfig"
} else {
    Write-Output 'kproxy: no kube-proxy kubeconfig found (KUBEPROXY_KUBECONFIG, /var/lib/kube-proxy/kubeconfig.conf): using the in-cluster configuration'
}
if ($env:KUBEPROXY_V) {
    $kproxyArgs += "--v=$env:KUBEPROXY_V"
}
Write-Output "kproxy: started as kube-proxy/start.ps1: $($kproxyArgs -join ' ')"
& $start @kproxyArgs
exit $LASTEXITCODE
