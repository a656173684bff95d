//! A relay from a socket in nodewarden's pod to the upgrade-agent's socket
//! on the node. The agent's socket is root's (mode 0755): only root can
//! connect. The chart runs this relay as root, with no capability, beside
//! nodewarden, which stays user 65532 and reaches the agent through the
//! relay's socket (group-writable, in a volume of the pod).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

/// Listens on `listen` (mode 0660) and relays every connection to `to`
/// until the process ends.
pub async fn relay(listen: &Path, to: PathBuf) -> std::io::Result<()> {
    // A socket left by an earlier run of the pod's volume.
    let _ = std::fs::remove_file(listen);
    let listener = UnixListener::bind(listen)?;
    std::fs::set_permissions(listen, std::fs::Permissions::from_mode(0o660))?;
    loop {
        let (mut inbound, _) = listener.accept().await?;
        let to = to.clone();
        tokio::spawn(async move {
            match UnixStream::connect(&to).await {
                Ok(mut outbound) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(e) => {
                    tracing::warn!(socket = %to.display(), error = %e, "the upgrade-agent's socket refused the relay")
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_go_both_ways_through_a_group_writable_socket() {
        let dir = tempfile::tempdir().expect("a dir");
        let (agent, relayed) = (dir.path().join("agent.sock"), dir.path().join("relay.sock"));
        let echo = UnixListener::bind(&agent).expect("the agent's socket");
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                let mut buf = [0u8; 5];
                if s.read_exact(&mut buf).await.is_ok() {
                    let _ = s.write_all(&buf.map(|b| b.to_ascii_uppercase())).await;
                }
            }
        });
        let listen = relayed.clone();
        let running = tokio::spawn(async move { relay(&listen, agent).await });
        let mut client = loop {
            match UnixStream::connect(&relayed).await {
                Ok(c) => break c,
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(10)).await,
            }
        };
        let mode = std::fs::metadata(&relayed)
            .expect("the socket")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o660);
        client.write_all(b"hello").await.expect("writing");
        let mut answer = [0u8; 5];
        client.read_exact(&mut answer).await.expect("reading");
        assert_eq!(&answer, b"HELLO");
        running.abort();
    }
}
