// The local fake of Azure Resource Manager's compute API (scale sets) and of
// Azure AD's and IMDS's token endpoints for nodewarden's Azure provider tests
// (see README.md). Its wire format is that of the generated armcompute/v6
// models; build.sh builds it into the cache outside the repository. go.sum was
// made with `GOTOOLCHAIN=local go mod tidy`.
module github.com/nodewarden/nodewarden/e2e/azurefake

go 1.26.0

require (
	github.com/Azure/azure-sdk-for-go/sdk/azcore v1.17.1
	github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v6 v6.4.0
)

require (
	github.com/Azure/azure-sdk-for-go/sdk/internal v1.10.0 // indirect
	golang.org/x/net v0.37.0 // indirect
	golang.org/x/text v0.23.0 // indirect
)
