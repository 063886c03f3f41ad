//! The etcd calls the registry makes, over stubs generated from our own `proto/etcd/` (the
//! part of etcd's v3 API we use, compiled by protox: no `protoc`, no etcd client crate).
//!
//! With `[cluster]`'s user, `connect` authenticates once and every later call carries the
//! token in its `token` metadata, as etcd's own clients do.

use super::EtcdChannel;
use pb::etcdserverpb::auth_client::AuthClient;
use pb::etcdserverpb::kv_client::KvClient;
use pb::etcdserverpb::lease_client::LeaseClient;
use pb::etcdserverpb::watch_client::WatchClient;
use pb::etcdserverpb::{
    AuthenticateRequest, Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest,
    LeaseKeepAliveResponse, LeaseRevokeRequest, LeaseTimeToLiveRequest, PutRequest, PutResponse,
    RangeRequest, RangeResponse, RequestOp, TxnRequest, TxnResponse, WatchCreateRequest,
    WatchProgressRequest, WatchRequest, WatchResponse, compare, request_op, watch_request,
};
use pb::v3electionpb::CampaignRequest;
use pb::v3electionpb::election_client::ElectionClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::{Status, Streaming};

/// etcd's messages and client stubs (build.rs, from `proto/etcd/`). One module per etcd
/// package, side by side, as the generated code refers to its neighbours.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    pub mod etcdserverpb {
        tonic::include_proto!("etcdserverpb");
    }
    pub mod mvccpb {
        tonic::include_proto!("mvccpb");
    }
    pub mod v3electionpb {
        tonic::include_proto!("v3electionpb");
    }
}

/// The channel with the session's token on every call.
type Authed = InterceptedService<EtcdChannel, Token>;

/// A session's handle on etcd; clones share the channel (the election campaigns on one).
#[derive(Clone)]
pub struct Client {
    kv: KvClient<Authed>,
    lease: LeaseClient<Authed>,
    watch: WatchClient<Authed>,
    election: ElectionClient<Authed>,
}

impl Client {
    /// A client over `channel`; with `user` (name, password), after authenticating, the one
    /// round trip made here.
    pub async fn connect(
        channel: &EtcdChannel,
        user: Option<(String, String)>,
    ) -> Result<Self, Status> {
        let token = match user {
            Some((name, password)) => {
                let answer = AuthClient::new(channel.clone())
                    .authenticate(AuthenticateRequest { name, password })
                    .await?
                    .into_inner();
                let token = AsciiMetadataValue::try_from(answer.token)
                    .map_err(|_| Status::internal("etcd answered a token that is not ASCII"))?;
                Some(token)
            }
            None => None,
        };
        let channel = InterceptedService::new(channel.clone(), Token(token));
        Ok(Self {
            kv: KvClient::new(channel.clone()),
            lease: LeaseClient::new(channel.clone()),
            watch: WatchClient::new(channel.clone()),
            election: ElectionClient::new(channel),
        })
    }

    /// The key, if it exists (`kvs` holds it).
    pub async fn get(&mut self, key: impl Into<Vec<u8>>) -> Result<RangeResponse, Status> {
        let request = RangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        Ok(self.kv.range(request).await?.into_inner())
    }

    /// Every key under `prefix`.
    pub async fn get_prefix(
        &mut self,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<RangeResponse, Status> {
        let key = prefix.into();
        let request = RangeRequest {
            range_end: prefix_end(&key),
            key,
        };
        Ok(self.kv.range(request).await?.into_inner())
    }

    /// Writes the key, bound to `lease` (0: none).
    pub async fn put(
        &mut self,
        key: impl Into<Vec<u8>>,
        value: Vec<u8>,
        lease: i64,
    ) -> Result<PutResponse, Status> {
        let request = PutRequest {
            key: key.into(),
            value,
            lease,
        };
        Ok(self.kv.put(request).await?.into_inner())
    }

    /// Deletes the key (nothing happens if it does not exist).
    pub async fn delete(&mut self, key: impl Into<Vec<u8>>) -> Result<(), Status> {
        let request = DeleteRangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        };
        self.kv.delete_range(request).await?;
        Ok(())
    }

    /// Runs a transaction (`Compare` and `RequestOp` have the constructors it takes).
    pub async fn txn(&mut self, txn: TxnRequest) -> Result<TxnResponse, Status> {
        Ok(self.kv.txn(txn).await?.into_inner())
    }

    /// A new lease of `ttl` seconds: its id.
    pub async fn grant(&mut self, ttl: i64) -> Result<i64, Status> {
        let answer = self.lease.lease_grant(LeaseGrantRequest { ttl }).await?;
        Ok(answer.into_inner().id)
    }

    /// Ends the lease, deleting the keys bound to it.
    pub async fn revoke(&mut self, lease: i64) -> Result<(), Status> {
        self.lease
            .lease_revoke(LeaseRevokeRequest { id: lease })
            .await?;
        Ok(())
    }

    /// The lease's remaining seconds; 0 or less when etcd no longer has it.
    pub async fn time_to_live(&mut self, lease: i64) -> Result<i64, Status> {
        let request = LeaseTimeToLiveRequest { id: lease };
        Ok(self
            .lease
            .lease_time_to_live(request)
            .await?
            .into_inner()
            .ttl)
    }

    /// A stream renewing `lease`, renewed once here: an error when etcd no longer has it.
    pub async fn keep_alive(&mut self, lease: i64) -> Result<KeepAlive, Status> {
        let (requests, queued) = mpsc::channel(4);
        // The first renewal opens the stream: etcd answers a stream's headers with its first
        // message, so the call would not return before a request went out.
        let first = LeaseKeepAliveRequest { id: lease };
        requests.try_send(first).expect("an empty channel has room");
        let answers = self
            .lease
            .lease_keep_alive(ReceiverStream::new(queued))
            .await?;
        let mut keeper = KeepAlive {
            lease,
            requests,
            answers: answers.into_inner(),
        };
        if keeper.answer().await?.ttl <= 0 {
            return Err(Status::not_found(format!("lease {lease:x} not found")));
        }
        Ok(keeper)
    }

    /// A watch of every key under `prefix`, from `start_revision` on.
    pub async fn watch_prefix(
        &mut self,
        prefix: impl Into<Vec<u8>>,
        start_revision: i64,
    ) -> Result<Watch, Status> {
        let key = prefix.into();
        let create = WatchCreateRequest {
            range_end: prefix_end(&key),
            key,
            start_revision,
        };
        let (requests, queued) = mpsc::channel(4);
        requests
            .try_send(watch(watch_request::RequestUnion::CreateRequest(create)))
            .expect("an empty channel has room");
        let answers = self.watch.watch(ReceiverStream::new(queued)).await?;
        Ok(Watch {
            requests,
            answers: answers.into_inner(),
        })
    }

    /// Stands in `election` as `candidate`, on `lease`; returns once the candidate leads
    /// (which may be never: the caller bounds the wait).
    pub async fn campaign(
        &mut self,
        election: impl Into<Vec<u8>>,
        candidate: impl Into<Vec<u8>>,
        lease: i64,
    ) -> Result<(), Status> {
        let request = CampaignRequest {
            name: election.into(),
            lease,
            value: candidate.into(),
        };
        self.election.campaign(request).await?;
        Ok(())
    }
}

/// A lease's keep-alive stream.
pub struct KeepAlive {
    lease: i64,
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    answers: Streaming<LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Renews the lease; the answer's `ttl` is 0 or less when etcd no longer has it.
    pub async fn renew(&mut self) -> Result<LeaseKeepAliveResponse, Status> {
        let request = LeaseKeepAliveRequest { id: self.lease };
        if self.requests.send(request).await.is_err() {
            return Err(Status::unavailable("the keep-alive stream is closed"));
        }
        self.answer().await
    }

    async fn answer(&mut self) -> Result<LeaseKeepAliveResponse, Status> {
        (self.answers.message().await?)
            .ok_or_else(|| Status::unavailable("etcd ended the keep-alive stream"))
    }
}

/// A watch stream: its changes, and progress notices on request.
pub struct Watch {
    requests: mpsc::Sender<WatchRequest>,
    answers: Streaming<WatchResponse>,
}

impl Watch {
    /// Asks for an answer carrying etcd's current revision, even with no change to report.
    pub async fn request_progress(&mut self) -> Result<(), Status> {
        let progress = watch(watch_request::RequestUnion::ProgressRequest(
            WatchProgressRequest {},
        ));
        (self.requests.send(progress).await)
            .map_err(|_| Status::unavailable("the watch stream is closed"))
    }

    /// The next answer; `None` when etcd ended the stream.
    pub async fn message(&mut self) -> Result<Option<WatchResponse>, Status> {
        self.answers.message().await
    }
}

fn watch(request: watch_request::RequestUnion) -> WatchRequest {
    WatchRequest {
        request_union: Some(request),
    }
}

impl Compare {
    /// Holds while `key` does not exist.
    pub fn absent(key: impl Into<Vec<u8>>) -> Self {
        Self::equal(key, compare::TargetUnion::CreateRevision(0))
    }

    /// Holds while `key` was last written at `revision`.
    pub fn written_at(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Self::equal(key, compare::TargetUnion::ModRevision(revision))
    }

    fn equal(key: impl Into<Vec<u8>>, target: compare::TargetUnion) -> Self {
        let kind = match target {
            compare::TargetUnion::CreateRevision(_) => compare::CompareTarget::Create,
            compare::TargetUnion::ModRevision(_) => compare::CompareTarget::Mod,
        };
        Self {
            result: compare::CompareResult::Equal.into(),
            target: kind.into(),
            key: key.into(),
            target_union: Some(target),
        }
    }
}

impl RequestOp {
    /// Reads the key.
    pub fn get(key: impl Into<Vec<u8>>) -> Self {
        Self::of(request_op::Request::RequestRange(RangeRequest {
            key: key.into(),
            range_end: Vec::new(),
        }))
    }

    /// Writes the key, bound to `lease` (0: none).
    pub fn put(key: impl Into<Vec<u8>>, value: Vec<u8>, lease: i64) -> Self {
        Self::of(request_op::Request::RequestPut(PutRequest {
            key: key.into(),
            value,
            lease,
        }))
    }

    /// Deletes the key.
    pub fn delete(key: impl Into<Vec<u8>>) -> Self {
        Self::of(request_op::Request::RequestDeleteRange(
            DeleteRangeRequest {
                key: key.into(),
                range_end: Vec::new(),
            },
        ))
    }

    fn of(request: request_op::Request) -> Self {
        Self {
            request: Some(request),
        }
    }
}

/// The end of the range of keys starting with `prefix`: the prefix with its last byte below
/// 0xff raised by one (the bytes after it dropped); `\0` (every key) when there is none.
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Adds the session's token, when it has one, to every call.
#[derive(Clone)]
struct Token(Option<AsciiMetadataValue>);

impl tonic::service::Interceptor for Token {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(token) = &self.0 {
            request.metadata_mut().insert("token", token.clone());
        }
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_range_ends_past_every_key_that_starts_with_it() {
        assert_eq!(prefix_end(b"/infergate/"), b"/infergate0");
        assert_eq!(prefix_end(b"a\xff\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }
}
