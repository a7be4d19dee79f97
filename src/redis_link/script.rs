//! Lua scripts called by their hash.

use redis::{Cmd, ToRedisArgs};

/// A Lua script called by its SHA-1 (`EVALSHA`), so that Redis neither receives nor hashes
/// its text on every call. A server that does not know it yet (new, restarted, another
/// cluster node) answers `NOSCRIPT` and gets the text once with `EVAL`, which caches it.
pub struct Script {
    code: String,
    sha1: String,
}

impl Script {
    pub fn new(code: impl Into<String>) -> Self {
        let code = code.into();
        let sha1 = redis::Script::new(&code).get_hash().to_owned();
        Self { code, sha1 }
    }

    pub(super) fn call<K: ToRedisArgs, A: ToRedisArgs>(
        &self,
        by_text: bool,
        keys: &[K],
        args: &A,
    ) -> Cmd {
        let (name, script) = if by_text {
            ("EVAL", &self.code)
        } else {
            ("EVALSHA", &self.sha1)
        };
        let mut cmd = redis::cmd(name);
        cmd.arg(script).arg(keys.len()).arg(keys).arg(args);
        cmd
    }
}
