{{/*
A Deployment strategy from hub.strategy or webhook.strategy: type, and rollingUpdate unless the
type is Recreate (the API server refuses rollingUpdate with Recreate, and Helm merges the default
rollingUpdate into a user's `type: Recreate`).
*/}}
{{- define "karpenter-hub.strategy" -}}
{{- $strategy := dict }}
{{- with .type }}
{{- $_ := set $strategy "type" . }}
{{- end }}
{{- if and .rollingUpdate (ne (toString .type) "Recreate") }}
{{- $_ := set $strategy "rollingUpdate" .rollingUpdate }}
{{- end }}
{{- toYaml $strategy }}
{{- end }}

{{/*
Checks on the pods as the Deployment templates render them, for what the schema cannot state: a
ServiceAccount to run as, and the extra* values adding nothing the pod already has (a flag given
twice stops the binary at start; a repeated env or volume name, or a mount of no volume, is
refused by the API server at install, far from the value that caused it). Each failure names the
value and the fix. templates/checks.yaml runs it.
*/}}
{{- define "karpenter-hub.checkPods" -}}
{{- range $component := list "hub" "webhook" }}
{{- $v := index $.Values $component }}
{{- if or (eq $component "hub") $.Values.webhook.enabled }}
{{- if and (not $v.serviceAccount.create) (not $v.serviceAccount.name) }}
{{- fail (printf "%s.serviceAccount.create is false but %s.serviceAccount.name is empty: name the existing ServiceAccount the %s runs as (in the release namespace), or set %s.serviceAccount.create=true." $component $component $component $component) }}
{{- end }}
{{- $strategy := $v.strategy | default dict }}
{{- $ru := $strategy.rollingUpdate | default dict }}
{{- if and (ne (toString $strategy.type) "Recreate") (has (toString $ru.maxUnavailable) (list "0" "0%")) (has (toString $ru.maxSurge) (list "0" "0%")) }}
{{- fail (printf "%s.strategy.rollingUpdate.maxUnavailable and maxSurge are both 0: a rollout could never replace a pod. Raise one of them." $component) }}
{{- end }}
{{- $deployment := dict }}
{{- range $doc := splitList "\n---" (include (printf "%s/%s-deployment.yaml" $.Template.BasePath $component) $) }}
{{- $obj := fromYaml $doc }}
{{- if eq (toString (get $obj "kind")) "Deployment" }}
{{- $deployment = $obj }}
{{- end }}
{{- end }}
{{- $pod := $deployment.spec.template.spec }}
{{- $container := first $pod.containers }}
{{- $flags := dict }}
{{- range $arg := $container.args }}
{{- $flag := regexReplaceAll "(?s)=.*" (toString $arg) "" }}
{{- if hasPrefix "--" $flag }}
{{- if hasKey $flags $flag }}
{{- fail (printf "%s.extraArgs gives %s, which the %s is given already (by the chart, from its value in values.yaml, or earlier in %s.extraArgs); the binary refuses a flag given twice. Set that value instead, or give the flag once." $component $flag $component $component) }}
{{- end }}
{{- $_ := set $flags $flag true }}
{{- end }}
{{- end }}
{{- $env := dict }}
{{- range $e := $container.env | default list }}
{{- if hasKey $env $e.name }}
{{- fail (printf "%s.extraEnv sets %s, which the container has already (set by the chart, or earlier in %s.extraEnv). Drop it from %s.extraEnv%s." $component $e.name $component $component (ternary " (set hub.logFilter for RUST_LOG)" "" (eq $e.name "RUST_LOG"))) }}
{{- end }}
{{- $_ := set $env $e.name true }}
{{- end }}
{{- $volumes := dict }}
{{- range $vol := $pod.volumes | default list }}
{{- if hasKey $volumes $vol.name }}
{{- fail (printf "%s.extraVolumes declares volume %s, which the pod has already (the chart's, or earlier in %s.extraVolumes). Give it another name." $component $vol.name $component) }}
{{- end }}
{{- $_ := set $volumes $vol.name true }}
{{- end }}
{{- $paths := dict }}
{{- range $m := $container.volumeMounts | default list }}
{{- if not (hasKey $volumes $m.name) }}
{{- fail (printf "%s.extraVolumeMounts mounts volume %s, which the pod does not have: declare it in %s.extraVolumes." $component $m.name $component) }}
{{- end }}
{{- if hasKey $paths $m.mountPath }}
{{- fail (printf "%s.extraVolumeMounts mounts something at %s, where the container has a mount already. Choose another mountPath." $component $m.mountPath) }}
{{- end }}
{{- $_ := set $paths $m.mountPath true }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The hub's leader election timings, in the order the binary demands (it refuses to start
otherwise). templates/checks.yaml runs it.
*/}}
{{- define "karpenter-hub.checkLeaderElection" -}}
{{- $le := .Values.hub.leaderElection }}
{{- if $le.enabled }}
{{- if ge (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds) }}
{{- fail (printf "hub.leaderElection.renewDeadlineSeconds (%d) must be below hub.leaderElection.leaseDurationSeconds (%d): a leader must stop acting before its Lease expires and a standby takes it. Lower the deadline or raise the duration." (int $le.renewDeadlineSeconds) (int $le.leaseDurationSeconds)) }}
{{- end }}
{{- if ge (int $le.retryPeriodSeconds) (int $le.renewDeadlineSeconds) }}
{{- fail (printf "hub.leaderElection.retryPeriodSeconds (%d) must be below hub.leaderElection.renewDeadlineSeconds (%d): otherwise one missed renewal already stops the leader. Lower the retry period or raise the deadline." (int $le.retryPeriodSeconds) (int $le.renewDeadlineSeconds)) }}
{{- end }}
{{- end }}
{{- end }}
