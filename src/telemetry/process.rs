//! Process figures read from `/proc/self` at each scrape: CPU time, resident memory and
//! file descriptors, under the names every Prometheus client library uses, so standard
//! dashboards and alerts work unchanged. Elsewhere than Linux they are simply absent.

use std::fs;

pub const CPU_SECONDS: &str = "process_cpu_seconds_total";
pub const RESIDENT_MEMORY: &str = "process_resident_memory_bytes";
pub const OPEN_FDS: &str = "process_open_fds";
pub const MAX_FDS: &str = "process_max_fds";

/// Linux reports CPU times in `/proc` in USER_HZ, 100 per second on every architecture
/// it supports.
const TICKS_PER_SECOND: f64 = 100.0;

pub fn describe() {
    use metrics::describe_gauge;
    describe_gauge!(
        CPU_SECONDS,
        metrics::Unit::Seconds,
        "CPU time this process has used, user and system."
    );
    describe_gauge!(
        RESIDENT_MEMORY,
        metrics::Unit::Bytes,
        "Resident memory of this process."
    );
    describe_gauge!(OPEN_FDS, "File descriptors this process has open.");
    describe_gauge!(MAX_FDS, "Most file descriptors this process may open.");
}

/// Reads the figures now; any that cannot be read keeps its last value.
pub fn record() {
    if let Some(seconds) = cpu_seconds() {
        metrics::gauge!(CPU_SECONDS).set(seconds);
    }
    if let Some(bytes) = resident_bytes() {
        metrics::gauge!(RESIDENT_MEMORY).set(bytes);
    }
    if let Ok(fds) = fs::read_dir("/proc/self/fd") {
        metrics::gauge!(OPEN_FDS).set(fds.count() as f64);
    }
    if let Some(max) = max_fds() {
        metrics::gauge!(MAX_FDS).set(max);
    }
}

/// utime and stime: fields 14 and 15 of `/proc/self/stat`, counted after the command
/// name, which may itself hold spaces and parentheses.
fn cpu_seconds() -> Option<f64> {
    let stat = fs::read_to_string("/proc/self/stat").ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let user: f64 = fields.next()?.parse().ok()?;
    let system: f64 = fields.next()?.parse().ok()?;
    Some((user + system) / TICKS_PER_SECOND)
}

fn resident_bytes() -> Option<f64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024.0)
}

fn max_fds() -> Option<f64> {
    let limits = fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_of_this_process_are_read() {
        if !std::path::Path::new("/proc/self/stat").exists() {
            return;
        }
        assert!(cpu_seconds().is_some_and(|s| s >= 0.0));
        assert!(resident_bytes().is_some_and(|b| b > 0.0));
        assert!(max_fds().is_some_and(|m| m > 0.0));
    }
}
