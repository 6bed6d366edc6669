{{/*
The recording rules and alerts: the PrometheusRule's spec. deploy/prometheus/rules.yml is
this template rendered with the chart's defaults (a test holds the two equal), for
Prometheus setups without Helm. Prometheus's own templates ({{ $labels.tool }}) are written
as Go raw strings so that Helm leaves them alone.
*/}}
{{- define "effectq.rules" -}}
{{- $rule := .Values.metrics.prometheusRule -}}
{{- $alerts := $rule.alerts -}}
{{- $hold := $rule.ledgerOutageHold -}}
{{- $enabled := list -}}
{{- range $name, $alert := $alerts }}{{ if $alert.enabled }}{{ $enabled = append $enabled $name }}{{ end }}{{ end -}}
# effectq: recording rules and alerts. Every metric, and what it answers: docs/metrics.md;
# every alert's runbook: docs/runbooks/<alert>.md. This file is charts/effectq's rules
# rendered with the chart's default values (the chart renders the same rules with your
# thresholds and switches); `promtool test rules rules_test.yml` unit-tests it.
#
# Every rule keeps the `namespace` target label, so that two installations scraped by one
# Prometheus (staging and production) never merge.
#
# Two kinds of series, aggregated differently:
# * process-local (effectq_claims_total, effectq_effects_total, effectq_fenced_writes_total,
#   effectq_dead_letters_total, effectq_worker_restarts_total,
#   effectq_reconciler_resolutions_total, the *_seconds histograms): each worker pool and
#   reconciler counts its own work, so they are SUMMED across targets;
# * ledger-derived (effectq_duplicates_suppressed_total, effectq_conflicts_total,
#   effectq_unknown_effects, effectq_inflight_claims, effectq_expired_claims,
#   effectq_expired_leases, effectq_reconciler_lag_seconds, effectq_ledger_up,
#   effectq_queue_messages): read from Redis at scrape time, the same on every target, so
#   they are aggregated with MAX across targets (a sum would count them once per target).
#
# While the ledger cannot be read, the ledger-derived series vanish from every scrape. The
# alerts built on them (UNKNOWN effects, reconciler lag) then hold their last value for up
# to {{ $hold }} (last_over_time) instead of resolving: an outage is when they matter most.
groups:
  - name: effectq.recording
    rules:
      - record: effectq:duplicates_suppressed:rate5m
        expr: max by (namespace, tool, stage) (rate(effectq_duplicates_suppressed_total[5m]))
      - record: effectq:duplicates_suppressed:rate1h
        expr: max by (namespace, tool, stage) (rate(effectq_duplicates_suppressed_total[1h]))
      - record: effectq:claims_acquired:rate5m
        expr: sum by (namespace, tool) (rate(effectq_claims_total{outcome="acquired"}[5m]))
      - record: effectq:claims_acquired:rate1h
        expr: sum by (namespace, tool) (rate(effectq_claims_total{outcome="acquired"}[1h]))
      {{- range $window := list "5m" "1h" }}
      # Every call that reached a decision: suppressed at either stage, or let through (a
      # claim acquired). Either side may have no series yet: the `or`s keep the other.
      - record: effectq:decisions:rate{{ $window }}
        expr: |
          (
            sum by (namespace) (effectq:duplicates_suppressed:rate{{ $window }})
            + sum by (namespace) (effectq:claims_acquired:rate{{ $window }})
          )
          or sum by (namespace) (effectq:duplicates_suppressed:rate{{ $window }})
          or sum by (namespace) (effectq:claims_acquired:rate{{ $window }})
      {{- end }}
      # Suppression ratio: duplicates suppressed at a stage / every decision. The stages
      # add up to the total ratio.
      - record: effectq:suppression_ratio:rate5m
        expr: |
          sum by (namespace, stage) (effectq:duplicates_suppressed:rate5m)
            / ignoring (stage) group_left ()
          effectq:decisions:rate5m
      - record: effectq:suppression_ratio_total:rate5m
        expr: sum by (namespace) (effectq:duplicates_suppressed:rate5m) / effectq:decisions:rate5m
      - record: effectq:suppression_ratio_total:rate1h
        expr: sum by (namespace) (effectq:duplicates_suppressed:rate1h) / effectq:decisions:rate1h
{{- if $enabled }}

  - name: effectq.alerts
    rules:
      {{- with $alerts.EffectqLedgerDown }}{{ if .enabled }}
      - alert: EffectqLedgerDown
        # No target can read the ledger, or the worker path fails closed on it, or no
        # effectq target reports at all (every pod down, or none scraped).
        expr: |
          (max by (namespace) (effectq_ledger_up) == 0)
          or
          (
            sum by (namespace) (rate(effectq_claims_total{outcome="unavailable"}[5m]))
            > {{ .unavailableClaimsPerSecond }}
          )
          or
          absent(effectq_ledger_up{ {{- $rule.targetSelector -}} })
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: "the effectq ledger is down or failing"
          description: >-
            No metrics endpoint can read the ledger's Redis, or workers answer claims
            "unavailable" (over {{ .unavailableClaimsPerSecond }}/s), or no effectq target
            reports at all. Every worker fails closed: messages retry, nothing executes;
            producers get 503.
          runbook_url: {{ printf "%s/EffectqLedgerDown.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqLedgerUnreadable }}{{ if .enabled }}
      - alert: EffectqLedgerUnreadable
        expr: min by (namespace) (effectq_ledger_up) == 0
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: "a metrics endpoint cannot read the ledger"
          description: >-
            The scrape-time ledger series (unknown, expired, suppression, lag) are missing
            from at least one target: its Redis is unreachable or refuses INFO.
          runbook_url: {{ printf "%s/EffectqLedgerUnreadable.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqUnknownEffects }}{{ if .enabled }}
      - alert: EffectqUnknownEffects
        # The second arm holds the last value while no target reads the ledger.
        expr: |
          (max by (namespace, tool) (effectq_unknown_effects) > 0)
          or
          (
            max by (namespace, tool) (last_over_time(effectq_unknown_effects[{{ $hold }}])) > 0
            unless on (namespace) (max by (namespace) (effectq_ledger_up) == 1)
          )
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"UNKNOWN {{ $labels.tool }} effects"`}}
          description: >-
            {{`The reconciler could not establish whether some {{ $labels.tool }} effects
            happened; each blocks its key until an operator resolves it with evidence.
            List them: effectq list --state unknown --tool {{ $labels.tool }}`}}
          runbook_url: {{ printf "%s/EffectqUnknownEffects.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqReconcilerLag }}{{ if .enabled }}
      - alert: EffectqReconcilerLag
        # Keep thresholdSeconds in step with your leases (tools' lease_s,
        # EFFECTQ_RECONCILER_LEASE_S; 30 s by default). The second arm holds the last value
        # while no target reads the ledger.
        expr: |
          (max by (namespace) (effectq_reconciler_lag_seconds) > {{ .thresholdSeconds }})
          or
          (
            max by (namespace) (last_over_time(effectq_reconciler_lag_seconds[{{ $hold }}]))
            > {{ .thresholdSeconds }}
            unless on (namespace) (max by (namespace) (effectq_ledger_up) == 1)
          )
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: "expired claims wait longer than a lease for a reconciler"
          description: >-
            The oldest expired lease has waited more than {{ .thresholdSeconds }} s: no
            reconciler is running, or it is behind. Their messages retry as blocked until
            it catches up.
          runbook_url: {{ printf "%s/EffectqReconcilerLag.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqReconcilerStalled }}{{ if .enabled }}
      - alert: EffectqReconcilerStalled
        expr: |
          time() - max by (namespace) (effectq_reconciler_last_pass_timestamp_seconds)
          > {{ .thresholdSeconds }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: "no reconciler pass has finished recently"
          description: >-
            No reconciler has finished a pass over the lease indexes for more than
            {{ .thresholdSeconds }} s: expired claims are not being settled.
          runbook_url: {{ printf "%s/EffectqReconcilerStalled.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqDeadLetters }}{{ if .enabled }}
      - alert: EffectqDeadLetters
        expr: |
          sum by (namespace, tool, reason) (increase(effectq_dead_letters_total[{{ .window }}]))
          > {{ .threshold }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"{{ $labels.tool }} messages dead-lettered ({{ $labels.reason }})"`}}
          description: >-
            {{`{{ $value | humanize }} {{ $labels.tool }} messages went to the dead-letter
            queue for {{ $labels.reason }}`}} in the last {{ .window }}. None of them will run
            again by itself; retries_exhausted is an effect that never ran.
          runbook_url: {{ printf "%s/EffectqDeadLetters.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqDeadLetterQueue }}{{ if .enabled }}
      - alert: EffectqDeadLetterQueue
        # The broker's count, not a counter's increase: it fires for a pod's first dead
        # letter, for dead letters no pod counted (undecodable, an unknown tool) and after a
        # restart, and it stays firing until someone requeues or purges them.
        expr: |
          max by (namespace, queue) (effectq_queue_messages{state="dead"}) > {{ .threshold }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"{{ $value | humanize }} messages wait in {{ $labels.queue }}'s dead-letter queue"`}}
          description: >-
            {{`Dead-lettered messages sit in {{ $labels.queue }}'s dead-letter queue`}}: none
            runs again by itself. Read why (effectq deadletters), then requeue or purge them.
          runbook_url: {{ printf "%s/EffectqDeadLetterQueue.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqWorkerRestarts }}{{ if .enabled }}
      - alert: EffectqWorkerRestarts
        expr: |
          sum by (namespace, pod, instance) (increase(effectq_worker_restarts_total[{{ .window }}]))
          > {{ .threshold }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"worker processes keep restarting in {{ $labels.instance }}"`}}
          description: >-
            {{`The supervisor restarted its Dramatiq processes {{ $value | humanize }} times`}}
            in the last {{ .window }}: they crash (a tool, memory, the broker) and every
            restart abandons the messages they ran.
          runbook_url: {{ printf "%s/EffectqWorkerRestarts.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqWorkersIdle }}{{ if .enabled }}
      - alert: EffectqWorkersIdle
        # The broker's ready messages (Redis: not yet acked; RabbitMQ: ready) while no worker
        # has taken a claim from that queue: no growth is needed, so it works on a queue that
        # a dead pool stopped draining at any depth, even beside a busy pool of the same
        # namespace (claims are counted by the queue their message came from).
        expr: |
          (max by (namespace, queue) (effectq_queue_messages{state="queued"}) > {{ .threshold }})
          unless on (namespace, queue)
          (sum by (namespace, queue) (rate(effectq_claims_total[{{ .window }}])) > 0)
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"messages wait in {{ $labels.queue }} and no worker takes a claim"`}}
          description: >-
            {{`Messages wait in {{ $labels.queue }}`}} while no worker has claimed anything for
            {{ .window }}: the pool is down, stuck, scaled to zero, or consuming other queues.
          runbook_url: {{ printf "%s/EffectqWorkersIdle.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqPaused }}{{ if .enabled }}
      - alert: EffectqPaused
        # From the ledger: every pod exports the same value, 0 for each declared tool and
        # queue when nothing is paused (a pause is a change of value, not a new series).
        expr: max by (namespace, kind, name) (effectq_paused) > 0
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"{{ $labels.kind }} {{ $labels.name }} is still paused"`}}
          description: >-
            {{`An operator paused {{ $labels.kind }} {{ $labels.name }}`}} (effectq pause) more
            than {{ .for }} ago and nobody resumed it: its messages wait in the delay queue, none
            runs. See who and why with effectq controls; resume it once the outage or upgrade
            is over.
          runbook_url: {{ printf "%s/EffectqPaused.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqConflicts }}{{ if .enabled }}
      - alert: EffectqConflicts
        expr: max by (namespace, tool) (rate(effectq_conflicts_total[5m])) > 0
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"{{ $labels.tool }} calls conflict with recorded effects"`}}
          description: >-
            {{`A producer sent a {{ $labels.tool }} call whose bound fields (amount, recipient,
            ...) differ from the effect recorded under the same key: refused, never executed.
            A replay with changed arguments, or an identity that is too coarse.`}}
          runbook_url: {{ printf "%s/EffectqConflicts.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqFencedWrites }}{{ if .enabled }}
      - alert: EffectqFencedWrites
        expr: sum by (namespace, tool, op) (increase(effectq_fenced_writes_total[{{ .window }}])) > 0
        labels:
          severity: {{ .severity }}
        annotations:
          summary: {{`"stale {{ $labels.tool }} holders writing ({{ $labels.op }} fenced)"`}}
          description: >-
            A worker or reconciler wrote under a fencing token that had been superseded: a
            holder paused past its lease (GC, SIGSTOP, a slow provider) and woke up after its
            claim was taken over. The ledger refused the write; the provider's own fencing or
            idempotency decides whether the effect ran twice.
          runbook_url: {{ printf "%s/EffectqFencedWrites.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}

      {{- with $alerts.EffectqSuppressionRatioShift }}{{ if .enabled }}
      - alert: EffectqSuppressionRatioShift
        # A sharp change either way: up, a producer is replaying (a retry storm, a
        # re-sent campaign); down to zero, keys stopped matching (identity or generation
        # changed) and duplicates may now be executed.
        expr: |
          abs(effectq:suppression_ratio_total:rate5m - effectq:suppression_ratio_total:rate1h)
          > {{ .threshold }}
          and on (namespace)
          effectq:decisions:rate5m > {{ .minDecisionsPerSecond }}
        for: {{ .for }}
        labels:
          severity: {{ .severity }}
        annotations:
          summary: "duplicate suppression ratio moved sharply from its hourly baseline"
          description: >-
            The share of calls suppressed as duplicates over the last 5 minutes differs
            from the last hour's by more than {{ .threshold }}. Compare stages in the
            dashboard.
          runbook_url: {{ printf "%s/EffectqSuppressionRatioShift.md" $rule.runbookBaseUrl | quote }}
      {{- end }}{{ end }}
{{- end }}
{{- end -}}
