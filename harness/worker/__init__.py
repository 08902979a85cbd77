"""One job, one judge process: starting it and collecting its signed verdict (`judge_process`), the private
channel to it (`judge_channel`), compute-sanitizer runs of it (`sanitizer`), and running a harness command in
its own process group (`process_group`)."""
