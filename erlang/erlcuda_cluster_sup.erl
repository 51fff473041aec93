%% @private
%% erlcuda's pg scope (`erlcuda_pg') and the cluster agent that joins it
%% (erlcuda_cluster): a new scope has no members, so the agent restarts with it.
-module(erlcuda_cluster_sup).
-behaviour(supervisor).

-export([start_link/0, init/1]).

-spec start_link() -> {ok, pid()} | ignore | {error, term()}.
start_link() ->
    supervisor:start_link({local, ?MODULE}, ?MODULE, []).

-spec init([]) -> {ok, {supervisor:sup_flags(), [supervisor:child_spec()]}}.
init([]) ->
    Flags = #{strategy => rest_for_one, intensity => 5, period => 10},
    Scope = #{id => erlcuda_pg,
              start => {pg, start_link, [erlcuda_pg]},
              restart => permanent,
              shutdown => 5000,
              type => worker,
              modules => [pg]},
    Agent = #{id => erlcuda_cluster,
              start => {erlcuda_cluster, start_link, []},
              restart => permanent,
              shutdown => 5000,
              type => worker,
              modules => [erlcuda_cluster]},
    {ok, {Flags, [Scope, Agent]}}.
