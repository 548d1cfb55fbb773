# Runs kproxy.exe in kproxy's HostProcess container (windows/daemonset.yaml)
# with the arguments this script was given, plus --source-vip when this node
# has one:
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
    $kproxyArgs += "--source-vip=$vip"
}

& $kproxy @kproxyArgs
exit $LASTEXITCODE
