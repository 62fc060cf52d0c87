//! What a process's sockets are connected to, from /proc (Linux).

/// ESTABLISHED TCP connections of process `pid` to remote port `port`: its sockets from
/// `/proc/PID/fd`, matched by inode against `/proc/net/tcp` and `/proc/net/tcp6`.
pub fn established_to(pid: u32, port: u16) -> std::io::Result<usize> {
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))?
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter_map(|l| {
            let l = l.to_string_lossy();
            Some(l.strip_prefix("socket:[")?.strip_suffix(']')?.to_string())
        })
        .collect();
    let remote_port = format!(":{port:04X}");
    let mut n = 0;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        n += text
            .lines()
            .skip(1)
            .filter(|l| {
                // sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 9 && f[2].ends_with(&remote_port) && f[3] == "01" && inodes.contains(f[9])
            })
            .count();
    }
    Ok(n)
}

/// The port of a URL such as `https://127.0.0.1:6443` (`None` without an explicit port).
pub fn url_port(url: &str) -> Option<u16> {
    let authority = url.split("://").nth(1)?.split('/').next()?;
    authority.rsplit_once(':')?.1.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_of_urls() {
        assert_eq!(url_port("https://127.0.0.1:6443"), Some(6443));
        assert_eq!(url_port("https://127.0.0.1:16443/"), Some(16443));
        assert_eq!(url_port("https://kubernetes.default.svc"), None);
    }

    #[test]
    fn a_connection_of_this_process_is_counted() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let pid = std::process::id();
        assert_eq!(established_to(pid, port).unwrap(), 0);
        let _a = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _b = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _accepted = (listener.accept().unwrap(), listener.accept().unwrap());
        // Both client sides; the accepted sides are connected *from* `port`, not to it.
        assert_eq!(established_to(pid, port).unwrap(), 2);
    }
}
