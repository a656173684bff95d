//! The sim-cloud's HTTP JSON API; its bodies are the types of
//! [`nodewarden_simwire`].
//!
//! | Method and path | Answer |
//! |---|---|
//! | `GET /healthz` | `ok` |
//! | `GET /groups` | every group: id, role, name, size, image, delays, labels |
//! | `GET /groups/{id}/image` | `{"image": ...}` |
//! | `PUT /groups/{id}/image` | body `{"image": ...}`; new instances boot from it |
//! | `POST /groups/{id}/instances` | optional body `{"requestId": ...}`; 201 with the new instance (200 with the earlier one for a repeated request ID) |
//! | `GET /instances` | every instance ever created, Terminated ones too |
//! | `GET /instances/{name}` | one instance; 404 if the cloud never had it |
//! | `GET /states?names=a,b` | those of the named instances the cloud has (at most 100 names), as `GET /instances` shows them |
//! | `DELETE /instances/{name}` | 202; starts the delete (repeating it is harmless) |
//! | `GET /faults`, `POST /faults` | the injected faults ([`Faults`]); POST replaces them |
//!
//! Errors are `{"error": ...}` with status 400, 404, 429 (with `Retry-After`)
//! or 500. Faults hit the cloud calls — everything under `/groups`,
//! `/instances/{name}` and `/states` — but not `GET /instances`, `/faults` or `/healthz`,
//! which are how tests watch and steer the sim.

use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::faults::{self, Verdict};
use crate::model::{Lifecycle, ModelError, now};
use crate::store::{SimStore, StoreError};
use nodewarden_simwire::{CreateBody, ErrorBody, Faults, ImageBody, MAX_STATES};

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

/// A finished answer: status, JSON body and, for throttling, a Retry-After.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
    retry_after: Option<u64>,
}

impl Answer {
    fn json<T: Serialize>(status: StatusCode, value: &T) -> Answer {
        match serde_json::to_vec(value) {
            Ok(body) => Answer {
                status,
                body,
                retry_after: None,
            },
            Err(e) => Answer::error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the answer: {e}"),
            ),
        }
    }

    fn error(status: StatusCode, message: impl Into<String>) -> Answer {
        let body = serde_json::to_vec(&ErrorBody {
            error: message.into(),
        })
        .unwrap_or_default();
        Answer {
            status,
            body,
            retry_after: None,
        }
    }

    fn into_response(self) -> Response<Full<Bytes>> {
        let mut response = Response::new(Full::new(Bytes::from(self.body)));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, header::HeaderValue::from(seconds));
        }
        response
    }
}

impl From<StoreError> for Answer {
    fn from(e: StoreError) -> Answer {
        let status = match &e {
            StoreError::Model(ModelError::UnknownGroup(_) | ModelError::UnknownInstance(_)) => {
                StatusCode::NOT_FOUND
            }
            StoreError::Model(ModelError::Invalid(_)) => StatusCode::BAD_REQUEST,
            StoreError::Persist(_) | StoreError::Writer(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Answer::error(status, e.to_string())
    }
}

impl From<ModelError> for Answer {
    fn from(e: ModelError) -> Answer {
        Answer::from(StoreError::Model(e))
    }
}

/// Faults apply to what a cloud provider calls, not to the test's controls.
fn is_cloud_call(path: &[&str]) -> bool {
    matches!(path, ["groups", ..] | ["instances", _] | ["states"])
}

async fn read_json<T: DeserializeOwned + Default>(body: Incoming) -> Result<T, Answer> {
    let bytes = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map_err(|e| Answer::error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")))?
        .to_bytes();
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| Answer::error(StatusCode::BAD_REQUEST, format!("invalid body: {e}")))
}

async fn handle(sim: Arc<SimStore>, req: Request<Incoming>) -> Answer {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let faults = sim.read(|c| c.faults.clone()).await;
    if is_cloud_call(&segments) {
        // Drawn outside any await: the thread's generator is not Send.
        let verdict = faults::verdict(&faults, &mut rand::rng());
        match verdict {
            Verdict::Serve => {}
            Verdict::Fail => {
                tracing::debug!(%method, %path, "fault: answering 500");
                return Answer::error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "injected fault: internal error",
                );
            }
            Verdict::Throttle { retry_after_seconds } => {
                tracing::debug!(%method, %path, "fault: answering 429");
                let mut answer = Answer::error(
                    StatusCode::TOO_MANY_REQUESTS,
                    "injected fault: rate limit exceeded",
                );
                answer.retry_after = Some(retry_after_seconds);
                return answer;
            }
        }
    }
    let query = req.uri().query().unwrap_or_default().to_string();
    let answer = route(&sim, &method, &segments, &query, req.into_body()).await;
    let mutation = method == Method::POST || method == Method::DELETE;
    if is_cloud_call(&segments)
        && mutation
        && answer.status.is_success()
        && faults::loses_response(&faults, &mut rand::rng())
    {
        tracing::debug!(%method, %path, "fault: the change was made but its answer is lost");
        return Answer::error(StatusCode::INTERNAL_SERVER_ERROR, "injected fault: answer lost");
    }
    answer
}

async fn route(sim: &SimStore, method: &Method, path: &[&str], query: &str, body: Incoming) -> Answer {
    let result = match (method, path) {
        (&Method::GET, ["healthz"]) => Ok(Answer::json(StatusCode::OK, &"ok")),
        (&Method::GET, ["groups"]) => Ok(Answer::json(StatusCode::OK, &sim.read(|c| c.group_views()).await)),
        (&Method::GET, ["groups", id, "image"]) => sim
            .read(|c| {
                c.group(id).map(|g| ImageBody {
                    image: g.image.clone(),
                })
            })
            .await
            .map(|image| Answer::json(StatusCode::OK, &image))
            .map_err(Answer::from),
        (&Method::PUT, ["groups", id, "image"]) => set_group_image(sim, id, body).await,
        (&Method::POST, ["groups", id, "instances"]) => create_instance(sim, id, body).await,
        (&Method::GET, ["instances"]) => {
            let at = now();
            let all: Vec<_> = sim
                .read(|c| c.instances.values().map(|i| i.view(at)).collect())
                .await;
            Ok(Answer::json(StatusCode::OK, &all))
        }
        (&Method::GET, ["instances", name]) => {
            let at = now();
            sim.read(|c| c.instance(name).map(|i| i.view(at)))
                .await
                .map(|view| Answer::json(StatusCode::OK, &view))
                .map_err(Answer::from)
        }
        (&Method::GET, ["states"]) => {
            let names: Vec<&str> = query
                .split('&')
                .filter_map(|pair| pair.strip_prefix("names="))
                .flat_map(|list| list.split(','))
                .filter(|name| !name.is_empty())
                .collect();
            if names.len() > MAX_STATES {
                return Answer::error(
                    StatusCode::BAD_REQUEST,
                    format!("at most {MAX_STATES} names a call, not {}", names.len()),
                );
            }
            let at = now();
            let known: Vec<_> = sim
                .read(|c| {
                    names
                        .iter()
                        .filter_map(|name| c.instance(name).ok().map(|i| i.view(at)))
                        .collect()
                })
                .await;
            Ok(Answer::json(StatusCode::OK, &known))
        }
        (&Method::DELETE, ["instances", name]) => {
            let at = now();
            sim.mutate(|c| c.delete(name, at))
                .await
                .map(|i| Answer::json(StatusCode::ACCEPTED, &i.view(at)))
                .map_err(Answer::from)
        }
        (&Method::GET, ["faults"]) => Ok(Answer::json(
            StatusCode::OK,
            &sim.read(|c| c.faults.clone()).await,
        )),
        (&Method::POST, ["faults"]) => set_faults(sim, body).await,
        _ => Err(Answer::error(StatusCode::NOT_FOUND, "no such endpoint")),
    };
    result.unwrap_or_else(|answer| answer)
}

async fn set_group_image(sim: &SimStore, id: &str, body: Incoming) -> Result<Answer, Answer> {
    let body: Option<ImageBody> = read_json(body).await?;
    let image = body
        .ok_or_else(|| Answer::error(StatusCode::BAD_REQUEST, "the body must be {\"image\": ...}"))?
        .image;
    sim.mutate(|c| c.set_group_image(id, &image)).await?;
    tracing::info!(group = id, image, "group image set");
    Ok(Answer::json(StatusCode::OK, &ImageBody { image }))
}

async fn create_instance(sim: &SimStore, group: &str, body: Incoming) -> Result<Answer, Answer> {
    let body: CreateBody = read_json(body).await?;
    let at = now();
    let (instance, new) = sim.mutate(|c| c.create(group, body.request_id, at)).await?;
    if new {
        tracing::info!(
            group,
            instance = instance.name,
            image = instance.image,
            "instance created"
        );
    }
    let status = if new { StatusCode::CREATED } else { StatusCode::OK };
    Ok(Answer::json(status, &instance.view(at)))
}

async fn set_faults(sim: &SimStore, body: Incoming) -> Result<Answer, Answer> {
    let faults: Faults = read_json(body).await?;
    faults
        .validate()
        .map_err(|e| Answer::error(StatusCode::BAD_REQUEST, e))?;
    let set = faults.clone();
    sim.mutate(move |c| {
        c.faults = set;
        Ok(())
    })
    .await?;
    tracing::info!(?faults, "faults set");
    Ok(Answer::json(StatusCode::OK, &faults))
}

/// The answer to one request of the API. The `nodewarden-simcloud` binary
/// serves it (on the operator's HTTP server, held to the sim-cloud's
/// connection limits).
pub async fn answer(sim: Arc<SimStore>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    handle(sim, req).await.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_hit_cloud_calls_but_not_the_test_controls() {
        assert!(is_cloud_call(&["groups"]));
        assert!(is_cloud_call(&["groups", "g", "instances"]));
        assert!(is_cloud_call(&["instances", "i"]));
        assert!(!is_cloud_call(&["instances"]));
        assert!(!is_cloud_call(&["faults"]));
        assert!(!is_cloud_call(&["healthz"]));
    }
}
