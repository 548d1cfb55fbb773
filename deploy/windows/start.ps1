# Runs kproxy.exe in kproxy's HostProcess container (windows/daemonset.yaml)
# with the arguments this script was given; when this node has a source VIP,
# it is written into a copy of the --config file (winkernel.sourceVip), since
# with --config kproxy ignores --source-vip, as upstream kube-proxy does.
# The source VIP is:
#   - the SOURCE_VIP environment variable, if set;
#   - else the file named by SOURCE_VIP_FILE, if it exists: a host-local IPAM
#     result, CNI 0.2.0 ({"ip4": {"ip": "10.244.1.2/24"}}) or later
#     ({"ips": [{"address": "10.244.1.2/24"}]}).
# Without either kproxy uses winkernel.sourceVip from its config, which only
# overlay networks need.
$ErrorActionPreference = 'Stop'

$kproxy = Join-Path $env:CONTAINER_SANDBOX_MOUNT_POINT 'kproxy/kproxy.exe'
$kproxyArgs = @($args)

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
