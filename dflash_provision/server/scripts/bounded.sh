# dflash bounded DEADLINE_S NONCE ARGV...: run ARGV on the target under common.sh's watchdog, so
# that a command that hangs (a `vllm --version` stuck importing, a probe waiting on a frozen
# disk) is ended THERE at the deadline, with whatever it started, instead of outliving the
# caller. NONCE only marks this shell's command line, so that reap.sh can find it when the
# caller is interrupted. Exit status: ARGV's; 143 when ended (by the watchdog or reap.sh).
deadline=$1
shift 2
# TERM is held until the foreground command has ended (the watchdog ends it next: it is one of
# this shell's children), then the shell exits 143.
trap 'exit 143' TERM
start_watchdog
"$@"
