# Runs kproxy.exe in kproxy's HostProcess container (windows/daemonset.yaml)
# with the arguments this script was given; when this node has a source VIP,
# it is written into a copy of the --config file (winkernel.sourceVip), since
# with --config kproxy ignores --source-vip, as upstream kube-proxy does.
# The source VIP is:
#   - the SOURCE_VIP environment variable, if set;
#   - else the file named by SOURCE_VIP_FILE, if set and it exists: a
#     host-local IPAM result, CNI 0.2.0 ({"ip4": {"ip": "10.244.1.2/24"}}) or
#     later ({"ips": [{"address": "10.244.1.2/24"}]}).
# Without either, kproxy uses winkernel.sourceVip from its config, else finds
# one itself on overlay networks (docs/windows.md).
#
# Paths: containerd 1.7 and later bind-mount volumes at their mountPath;
# containerd 1.6 only under $env:CONTAINER_SANDBOX_MOUNT_POINT. When the
# --config file is not where the DaemonSet says, it is read from the sandbox,
# and copies of it and of its kubeconfig are written with every path they
# name (the kubeconfig, the service account token and CA) resolved the same
# way; so is a --kubeconfig file given as a flag (kube-proxy/start.ps1, the
# shim for kube-proxy DaemonSets, gives one).
$ErrorActionPreference = 'Stop'

$sandbox = "$env:CONTAINER_SANDBOX_MOUNT_POINT"
$kproxy = Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/kproxy.exe'

# Resolve-MountPath returns the path as written when it exists (containerd
# 1.7+), else the same path under the sandbox mount point when that exists
# (containerd 1.6), else the path as written.
function Resolve-MountPath([string]$path) {
    if (-not $sandbox -or (Test-Path -LiteralPath $path)) { return $path }
    $inSandbox = Join-Path $sandbox $path
    if (Test-Path -LiteralPath $inSandbox) { return $inSandbox }
    return $path
}

# Copy-WithResolvedPaths writes a copy of a YAML file in which the values of
# the keys named are resolved with Resolve-MountPath; it returns the copy's path.
function Copy-WithResolvedPaths([string]$src, [string]$name, [string[]]$keys, [hashtable]$override) {
    $text = Get-Content -Raw -LiteralPath $src
    foreach ($key in $keys) {
        $pattern = "(?m)^(\s*$key\s*:\s*)(\S+)\s*$"
        $text = [regex]::Replace($text, $pattern, {
            param($m)
            $value = $m.Groups[2].Value.Trim('"', "'")
            if ($override -and $override.ContainsKey($key)) { $resolved = $override[$key] } else { $resolved = Resolve-MountPath $value }
            $m.Groups[1].Value + '"' + ($resolved -replace '\\', '/') + '"'
        })
    }
    $dir = Join-Path $env:TEMP 'kproxy'
    New-Item -ItemType Directory -Force -Path $dir | Out-Null
    $dst = Join-Path $dir $name
    Set-Content -LiteralPath $dst -Value $text -Encoding utf8
    return $dst
}

$kproxyArgs = @()
foreach ($arg in $args) {
    if ($arg -match '^--config=(.+)$') {
        $config = $Matches[1]
        $resolved = Resolve-MountPath $config
        if ($resolved -ne $config) {
            Write-Output "kproxy: containerd 1.6 volume paths under $sandbox"
            $configText = Get-Content -Raw -LiteralPath $resolved
            $override = @{}
            if ($configText -match '(?m)^\s*kubeconfig\s*:\s*(\S+)\s*$') {
                $kubeconfig = Resolve-MountPath $Matches[1].Trim('"', "'")
                $override['kubeconfig'] = Copy-WithResolvedPaths $kubeconfig 'kubeconfig.conf' @('certificate-authority', 'tokenFile') $null
            }
            $resolved = Copy-WithResolvedPaths $resolved 'config.conf' @('kubeconfig') $override
        }
        $arg = "--config=$resolved"
    } elseif ($arg -match '^--kubeconfig=(.+)$') {
        $kubeconfig = $Matches[1]
        $resolved = Resolve-MountPath $kubeconfig
        if ($resolved -ne $kubeconfig) {
            Write-Output "kproxy: containerd 1.6 volume paths under $sandbox"
            $resolved = Copy-WithResolvedPaths $resolved 'kubeconfig.conf' @('certificate-authority', 'tokenFile') $null
        }
        $arg = "--kubeconfig=$resolved"
    }
    $kproxyArgs += $arg
}

$vip = "$env:SOURCE_VIP".Trim()
if (-not $vip -and $env:SOURCE_VIP_FILE -and (Test-Path -LiteralPath $env:SOURCE_VIP_FILE)) {
    $result = Get-Content -Raw -LiteralPath $env:SOURCE_VIP_FILE | ConvertFrom-Json
    if ($result.ip4 -and $result.ip4.ip) {
        $vip = ($result.ip4.ip -split '/')[0]
    } elseif ($result.ips -and $result.ips[0].address) {
        $vip = ($result.ips[0].address -split '/')[0]
    } else {
        Write-Error "no address in $env:SOURCE_VIP_FILE"
    }
}
if ($vip) {
    Write-Output "kproxy source VIP: $vip"
    $i = [array]::FindIndex([string[]]$kproxyArgs, [Predicate[string]]{ param($a) $a -like '--config=*' })
    if ($i -lt 0) {
        $kproxyArgs += "--source-vip=$vip"
    } else {
        $src = $kproxyArgs[$i].Substring('--config='.Length)
        $dst = Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/config-with-source-vip.conf'
        $text = (Get-Content -Raw -LiteralPath $src) -replace '(?m)^winkernel:[ \t]*$', "winkernel:`n  sourceVip: `"$vip`""
        Set-Content -LiteralPath $dst -Value $text -NoNewline
        $kproxyArgs[$i] = "--config=$dst"
    }
}

& $kproxy @kproxyArgs
exit $LASTEXITCODE
